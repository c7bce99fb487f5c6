"""Parsing of `v{major}.{feature}.{iteration}` versions (docs/architecture.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

_VERSION_RE = re.compile(r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


class InvalidVersionError(ValueError):
    """A version string that is not `v{major}.{feature}.{iteration}`."""


@dataclass(frozen=True, order=True)
class Version:
    """A Runtime Kit or Runtime version."""

    major: int
    feature: int
    iteration: int

    def __str__(self) -> str:
        return f"v{self.major}.{self.feature}.{self.iteration}"


def parse_version(text: str, *, what: str = "version") -> Version:
    """Parse `1.13.0` or `v1.13.0`; raise InvalidVersionError naming `what` otherwise."""
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise InvalidVersionError(
            f"{what}: {text!r} is not a version; expected v{{major}}.{{feature}}.{{iteration}},"
            " e.g. v1.14.0"
        )
    major, feature, iteration = (int(part) for part in match.groups())
    return Version(major, feature, iteration)


def component_version(distribution: str = "lj-runtimekit-proto") -> Version:
    """The installed version of a Runtime Kit distribution (all share the VERSION file)."""
    return parse_version(metadata.version(distribution), what=f"{distribution} version")
