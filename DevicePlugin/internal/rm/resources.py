"""The Runtime inventory as kubelet resources (pure logic, no I/O).

One kubelet device per physical exclusive/TDM GPU under `resources.gpu`;
100 units per TDM GPU under `resources.core` and `resources.memory` (IDs
`<device-id>::<n>`); one resource per MIG profile for GPUs in MIG mode (they
offer nothing else); devices of the other kinds of the device-kind table (PPU,
AMD) whole under their resource. MIG and the kinds follow their Runtime-version
feature gates; a kind the table does not know is not offered.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.featuregate import Feature, GateReport
from lj_runtimekit.proto.pkg.protocol import Protocol

SLICE_UNITS = 100
"""Kubelet units of `resources.core` / `resources.memory` per TDM device."""

SLICE_SEPARATOR = "::"
MAX_DEVICE_ID = 63
"""The kubelet's limit on a device ID."""
_MAX_SLICED_ID = MAX_DEVICE_ID - len(SLICE_SEPARATOR) - len(str(SLICE_UNITS - 1))


class ResourceKind(enum.Enum):
    """What the kubelet's device IDs of a resource stand for."""

    WHOLE = "whole"
    """Whole physical devices (of one kind of the device-kind table)."""
    CORE = "core"
    """Core-percent units of TDM devices."""
    MEMORY = "memory"
    """Memory-percent units of TDM devices."""
    MIG = "mig"
    """MIG instances of one profile."""


@dataclass(frozen=True)
class KubeletDevice:
    """One device as listed to the kubelet."""

    id: str
    healthy: bool
    numa_node: int
    """NUMA node; -1 when unknown (no topology is sent)."""
    device_id: str
    """The physical device (or MIG instance) the kubelet device stands for."""


@dataclass(frozen=True)
class ResourceInfo:
    """A resource name and what its device IDs stand for."""

    name: str
    kind: ResourceKind
    mig_profile: str = ""


def slice_unit_id(device_id: str, unit: int) -> str:
    """Kubelet ID of one core/memory unit of a TDM device, `<device-id>::<n>`."""
    return f"{device_id}{SLICE_SEPARATOR}{unit}"


def slice_unit_device(unit_id: str) -> str | None:
    """The device ID of a core/memory unit ID, or None when it is not one."""
    device, sep, unit = unit_id.rpartition(SLICE_SEPARATOR)
    if not sep or not device or not unit.isdigit() or int(unit) >= SLICE_UNITS:
        return None
    return device


def resource_info(protocol: Protocol, name: str) -> ResourceInfo | None:
    """What the resource `name` is, or None when this plugin does not serve such a name."""
    res = protocol.resources
    if name in devicekind.whole_resources(res):
        return ResourceInfo(name, ResourceKind.WHOLE)
    if name == res.core:
        return ResourceInfo(name, ResourceKind.CORE)
    if name == res.memory:
        return ResourceInfo(name, ResourceKind.MEMORY)
    profile = res.mig_profile(name)
    if profile:
        return ResourceInfo(name, ResourceKind.MIG, profile)
    return None


def _healthy(health: int, runtime_up: bool) -> bool:
    return runtime_up and health == rpb.HEALTH_HEALTHY


@dataclass(frozen=True)
class Inventory:
    """The kubelet view of the node: resource name -> devices, plus what was left out."""

    resources: Mapping[str, tuple[KubeletDevice, ...]]
    skipped: tuple[str, ...] = ()
    """One line per device (or feature) left out, and why."""


def build_inventory(
    devices: Iterable[rpb.Device],
    protocol: Protocol,
    gates: GateReport,
    *,
    runtime_up: bool = True,
) -> Inventory:
    """Map Runtime devices to kubelet resources.

    Every resource the base features define (gpu, core, memory) is present even
    when empty, so the kubelet sees the plugin and a capacity of 0 instead of a
    missing resource. While the Runtime is away (`runtime_up` false) the last
    known devices are listed Unhealthy, not dropped.
    """
    res = protocol.resources
    out: dict[str, list[KubeletDevice]] = {res.gpu: [], res.core: [], res.memory: []}
    skipped: list[str] = []
    mig_on = gates.is_enabled(Feature.MIG)
    for known in devicekind.kinds():
        if known.feature is None or gates.is_enabled(known.feature):
            out.setdefault(known.resource(res), [])
    for dev in devices:
        healthy = _healthy(dev.health, runtime_up)
        kind = devicekind.by_value(dev.kind)
        if len(dev.id) > MAX_DEVICE_ID:
            skipped.append(f"device {dev.id!r}: ID longer than {MAX_DEVICE_ID} characters")
            continue
        if kind is None:
            skipped.append(f"device {dev.id}: device kind not reported by the Runtime")
            continue
        if kind.feature is not None and not gates.is_enabled(kind.feature):
            skipped.append(
                f"device {dev.id}: {kind.name} device, but the {kind.feature} feature gate is off"
            )
            continue
        if not kind.shareable:
            out[kind.resource(res)].append(KubeletDevice(dev.id, healthy, dev.numa_node, dev.id))
            continue
        if dev.mode == rpb.DEVICE_MODE_MIG:
            if not mig_on:
                skipped.append(f"device {dev.id}: MIG mode, but the MIG feature gate is off")
                continue
            for inst in dev.mig_instances:
                out.setdefault(res.mig(inst.profile), []).append(
                    KubeletDevice(
                        inst.id,
                        healthy and _healthy(inst.health, runtime_up),
                        dev.numa_node,
                        inst.id,
                    )
                )
            continue
        if dev.mode not in (rpb.DEVICE_MODE_EXCLUSIVE, rpb.DEVICE_MODE_TDM):
            skipped.append(f"device {dev.id}: sharing mode not reported by the Runtime")
            continue
        out[kind.resource(res)].append(KubeletDevice(dev.id, healthy, dev.numa_node, dev.id))
        if dev.mode == rpb.DEVICE_MODE_TDM and len(dev.id) > _MAX_SLICED_ID:
            skipped.append(
                f"device {dev.id}: ID longer than {_MAX_SLICED_ID} characters leaves no"
                " room for slice unit IDs; offered whole only"
            )
        elif dev.mode == rpb.DEVICE_MODE_TDM:
            for name in (res.core, res.memory):
                out[name].extend(
                    KubeletDevice(slice_unit_id(dev.id, n), healthy, dev.numa_node, dev.id)
                    for n in range(SLICE_UNITS)
                )
    return Inventory({k: tuple(v) for k, v in out.items()}, tuple(skipped))
