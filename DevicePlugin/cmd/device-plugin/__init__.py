"""lj-device-plugin command."""
