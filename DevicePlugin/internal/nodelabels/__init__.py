"""Node labels: device kind, model, count, mode, Runtime version."""
