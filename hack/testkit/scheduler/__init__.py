"""Test support: an in-memory API server double (like upstream pkg/scheduler/testing)."""
