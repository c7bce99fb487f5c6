"""Versions `v{major}.{feature}.{iteration}`: parsing and the component's own version."""

from lj_runtimekit.proto.pkg.version.version import (
    InvalidVersionError,
    Version,
    component_version,
    parse_version,
)

__all__ = ["InvalidVersionError", "Version", "component_version", "parse_version"]
