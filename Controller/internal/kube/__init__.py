"""Kubernetes API access with bounded retries of transient failures."""
