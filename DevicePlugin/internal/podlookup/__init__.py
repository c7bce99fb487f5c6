"""The node's pods: kubelet read-only /pods, API server fallback."""
