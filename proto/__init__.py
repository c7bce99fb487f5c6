"""LJ Runtime Kit contract: Runtime and kubelet device plugin APIs, shared client code."""
