"""The one table of device kinds every component reads.

A row says what the Runtime's `DeviceKind` value is called (node labels, the node
inventory annotation, metric labels), which extended resource offers a whole device of
that kind, which feature gate turns the kind on, and whether it can be sliced (TDM) or
split (MIG). Adding a kind: its enum value in the Runtime contract, one row here, one
protocol default (`resources.<key>`), one example node (docs/extending.md).

Policy for a kind that is not in the table (a newer Runtime): it is never offered to the
kubelet, never put in the node inventory (so never placed), and is labelled and exported
as `unknown`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.featuregate import Feature

if TYPE_CHECKING:
    from lj_runtimekit.proto.pkg.protocol import Resources

UNKNOWN = "unknown"
"""The name of a kind the table does not know."""


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device."""

    value: int
    """The Runtime contract's `DeviceKind` enum value."""
    name: str
    """Label value, node inventory kind and metric label."""
    resource_key: str
    """The protocol key `resources.<resource_key>` offering a whole device of this kind."""
    feature: Feature | None
    """The feature gate that turns the kind on; None: a base feature."""
    shareable: bool
    """TDM slices (core %/memory %) and MIG instances exist for this kind."""

    def resource(self, resources: Resources) -> str:
        """The extended resource name offering a whole device (protocol constants)."""
        return str(getattr(resources, self.resource_key))


KINDS: tuple[DeviceKind, ...] = (
    DeviceKind(pb.DEVICE_KIND_GPU, "gpu", "gpu", None, shareable=True),
    DeviceKind(pb.DEVICE_KIND_PPU, "ppu", "ppu", Feature.PPU_AMD_DEVICES, shareable=False),
    DeviceKind(pb.DEVICE_KIND_AMD, "amd", "amd", Feature.PPU_AMD_DEVICES, shareable=False),
)


def kinds() -> Iterator[DeviceKind]:
    """Every known kind, in table order."""
    return iter(KINDS)


def by_value(value: int) -> DeviceKind | None:
    """The kind with this Runtime enum value, None when unknown."""
    return next((k for k in KINDS if k.value == value), None)


def by_name(name: str) -> DeviceKind | None:
    """The kind with this name (case-insensitive), None when unknown."""
    lowered = name.lower()
    return next((k for k in KINDS if k.name == lowered), None)


def name_of(value: int) -> str:
    """The kind's name, `unknown` when the table does not know the value."""
    kind = by_value(value)
    return kind.name if kind else UNKNOWN


def names() -> tuple[str, ...]:
    """The names of every known kind."""
    return tuple(k.name for k in KINDS)


def whole_resources(resources: Resources) -> dict[str, DeviceKind]:
    """Whole-device resource name -> its kind."""
    return {k.resource(resources): k for k in KINDS}


def resource_names(resources: Resources) -> tuple[str, ...]:
    """Every extended resource the protocol names but MIG's (`resources.mig(profile)`): each
    kind's whole device, then the TDM core and memory units."""
    return (*whole_resources(resources), resources.core, resources.memory)
