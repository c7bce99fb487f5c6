"""The one table of minimum Runtime versions per feature, and its evaluation."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType

from lj_runtimekit.proto.pkg.version import Version, component_version, parse_version


class Feature(enum.StrEnum):
    """Features gated on the Runtime version."""

    MIG = "mig"
    PPU_AMD_DEVICES = "ppu-amd-devices"
    CONTAINER_METRICS = "container-metrics"
    TOPOLOGY_GANG = "topology-gang"


BASE_MINIMUM = Version(1, 13, 0)
"""Whole-device allocation, TDM core/memory slicing and basic monitoring."""

FEATURE_MINIMUMS: MappingProxyType[Feature, Version] = MappingProxyType(
    {
        Feature.MIG: Version(1, 14, 0),
        Feature.PPU_AMD_DEVICES: Version(1, 14, 0),
        Feature.CONTAINER_METRICS: Version(1, 14, 0),
        Feature.TOPOLOGY_GANG: Version(1, 15, 0),
    }
)


class RuntimeTooOldError(RuntimeError):
    """The Runtime is below the base minimum version."""


@dataclass(frozen=True)
class GateReport:
    """Which features are on for one Runtime version, and why the others are off."""

    runtime_version: Version
    enabled: frozenset[Feature]
    messages: tuple[str, ...] = field(default=())

    def is_enabled(self, feature: Feature) -> bool:
        """Whether `feature` is on."""
        return feature in self.enabled

    def require_base(self) -> None:
        """Raise RuntimeTooOldError when the Runtime cannot serve the base features."""
        if self.runtime_version < BASE_MINIMUM:
            raise RuntimeTooOldError(
                f"Runtime {self.runtime_version} is too old: the Runtime Kit needs Runtime"
                f" {BASE_MINIMUM} or newer (whole-device allocation, TDM slicing, monitoring)"
            )


def evaluate(runtime_version: str | Version, component: Version | None = None) -> GateReport:
    """Decide which gated features are on for `runtime_version`.

    A Runtime of another major version than the component's may have changed
    the contract incompatibly: no gated feature is vouched for and the report
    says so. Below a feature's minimum only that feature is off.
    """
    runtime = (
        runtime_version
        if isinstance(runtime_version, Version)
        else parse_version(runtime_version, what="Runtime version")
    )
    own = component if component is not None else component_version()
    if runtime.major != own.major:
        return GateReport(
            runtime_version=runtime,
            enabled=frozenset(),
            messages=(
                f"Runtime {runtime} has major version {runtime.major} but this component"
                f" ({own}) speaks the major-{own.major} contract; gated features"
                f" ({', '.join(sorted(FEATURE_MINIMUMS))}) stay off until both match",
            ),
        )
    enabled = frozenset(f for f, minimum in FEATURE_MINIMUMS.items() if runtime >= minimum)
    messages = tuple(
        f"feature {f} is off: it needs Runtime {minimum}, the node runs {runtime}"
        for f, minimum in FEATURE_MINIMUMS.items()
        if f not in enabled
    )
    return GateReport(runtime_version=runtime, enabled=enabled, messages=messages)
