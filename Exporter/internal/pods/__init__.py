"""The node's pods: the kubelet read-only /pods endpoint, with an API server fallback."""
