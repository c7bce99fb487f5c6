"""The Controller's Kubernetes API calls, on the shared API layer (proto/pkg/kube)."""
