"""Exporter internals, one package per concern."""
