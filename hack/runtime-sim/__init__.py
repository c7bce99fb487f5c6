"""Runtime simulator: serves the lingjun.runtime.v1 contract from a YAML node description."""
