"""A keyed work queue (one key never processed twice at once, per-key backoff)."""
