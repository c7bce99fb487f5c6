"""Commands of the Exporter."""
