"""The enable/disable Job of one node."""
