"""Kubernetes API access (in-cluster or kubeconfig)."""
