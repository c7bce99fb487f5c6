"""LJ Runtime Kit Device Plugin (kubelet device plugin API v1beta1)."""
