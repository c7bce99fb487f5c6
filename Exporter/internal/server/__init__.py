"""HTTP server: /metrics (gzip when asked) and /healthz."""
