"""Resource manager: the Runtime inventory as kubelet resources, kept current by its watch."""
