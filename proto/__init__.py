"""LJ Runtime Kit contract: Runtime gRPC API, kubelet device plugin API and the shared client code."""
