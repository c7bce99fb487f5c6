"""DRA mode: the kubelet DRA plugin that publishes the Runtime's inventory as ResourceSlices and
prepares ResourceClaims (docs/dra.md)."""
