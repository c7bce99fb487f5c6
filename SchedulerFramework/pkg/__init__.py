"""LJ Runtime Kit Scheduler Framework."""
