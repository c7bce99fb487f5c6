"""Reconcilers: Nodes (label -> Job) and Jobs (result -> Node)."""
