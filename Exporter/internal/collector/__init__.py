"""Background collection of the Runtime and pod views into immutable snapshots."""
