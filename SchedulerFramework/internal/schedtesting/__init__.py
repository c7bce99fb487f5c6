"""Test support: an in-memory API server double for the scheduler (like upstream pkg/scheduler/testing)."""
