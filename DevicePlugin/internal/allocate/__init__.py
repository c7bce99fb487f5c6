"""Allocate: find the pod by identity, ask the Runtime, answer the kubelet."""
