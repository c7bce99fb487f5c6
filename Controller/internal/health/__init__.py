"""Health endpoints (/healthz, /readyz)."""
