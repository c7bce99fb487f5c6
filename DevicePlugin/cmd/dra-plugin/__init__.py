"""lj-dra-plugin command."""
