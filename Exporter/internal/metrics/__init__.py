"""Prometheus metric families built from the latest snapshot."""
