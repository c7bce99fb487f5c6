"""Public packages of the Exporter."""
