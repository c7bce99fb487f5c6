"""LJ Runtime Kit Exporter: Prometheus metrics per device, MIG instance and pod."""
