"""Device Plugin internals, one package per concern."""
