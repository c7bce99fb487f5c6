"""Prometheus metrics of the Controller."""
