"""Per-resource DevicePlugin gRPC servers, registration with the kubelet, restart handling."""
