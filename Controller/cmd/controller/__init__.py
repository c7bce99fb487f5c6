"""The Controller operator (lj-controller)."""
