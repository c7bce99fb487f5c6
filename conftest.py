"""Root conftest: shared pytest plugins."""

pytest_plugins = ["lj_runtimekit.envtest.pytest_plugin"]
