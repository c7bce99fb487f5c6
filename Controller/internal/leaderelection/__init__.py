"""Lease-based leader election."""
