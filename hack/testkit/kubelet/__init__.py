"""A kubelet shim on the real device plugin API v1beta1 (tests, benchmarks, the sandbox)."""
