"""lj-exporter: the Exporter DaemonSet command."""
