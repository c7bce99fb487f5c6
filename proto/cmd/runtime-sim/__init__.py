"""lj-runtime-sim command."""
