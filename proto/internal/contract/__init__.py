"""Tooling for the Runtime contract: the additive-only compatibility check."""
