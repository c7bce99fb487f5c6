"""The Controller's settings, validated at start-up."""
