"""Per-device and per-container allocation from the pods' assignment annotations."""
