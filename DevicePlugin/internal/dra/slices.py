"""The ResourceSlice model of DRA mode: the Runtime's inventory as resource.k8s.io/v1 slices.

One pool per node (named after the node), in one or more slices. Devices are named by
naming.py and carry driver-domain attributes (`type`, `model`, `uuid`, `index`, `numaNode`,
`mode`, `pciBusID`, `nvlinkDomain`; a MIG instance also `profile`, `parentUUID`,
`parentIndex`) and capacity `memory`. A TDM-mode device of a sliceable kind allows
multiple allocations and has consumable `cores` and `memory` (naming.py). A MIG-mode GPU
publishes only its instances; its counter set (`slices`, `memory`) is consumed in part by
each instance, so two instances never overlap. An exclusive-mode GPU consumes its counter
set whole. A TDM-mode GPU consumes none: the allocator counts the counters of a device
that allows multiple allocations once per allocation within one scheduling cycle and
never across cycles, so counters would refuse a second share in one pod and guard
nothing else. An unhealthy device gets a NoSchedule taint (or, without device taints,
is left out).

Devices and MIG instances go to separate slices: kube-scheduler 1.34 re-checks the capacity
of the n-th device of a request against the n-th device of the candidate's slice, so in a
shared slice a partly used TDM device at its head would refuse every MIG instance of the
node; kept apart, a request's candidates are all in one slice (up to the API limits).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.naming import (
    CORES,
    MEMORY,
    WHOLE_CORES,
    device_name,
    memory_step,
    mig_name,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.devicekind import by_value
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.proto.pkg.quantity import format_quantity

API_VERSION = "resource.k8s.io/v1"

TYPE = "type"
"""Device attribute: the kind name (`gpu`, `ppu`, ...) of a device, `mig` of a MIG instance."""
MODE = "mode"
"""Device attribute: `exclusive`, `tdm` or `mig` (a MIG instance)."""
PROFILE = "profile"
"""Device attribute of a MIG instance: its profile, e.g. `1g.10gb`."""
MODEL = "model"
UUID = "uuid"
INDEX = "index"
"""Device attribute: the device's index on the node; of a MIG instance, its GPU instance id."""
NUMA_NODE = "numaNode"
PCI_BUS_ID = "pciBusID"
PARENT_UUID = "parentUUID"
PARENT_INDEX = "parentIndex"
NVLINK_DOMAIN = "nvlinkDomain"
"""Device attribute: the lowest index of the devices linked to this one by NVLink (directly or
through others); equal values share an NVLink domain, for `matchAttribute` constraints."""

MIG_TYPE = "mig"
TDM_MODE = "tdm"
EXCLUSIVE_MODE = "exclusive"

SLICES_COUNTER = "slices"
"""Counter of a GPU's counter set: MIG compute slices."""
MEMORY_COUNTER = "memory"
"""Counter of a GPU's counter set: memory bytes."""
MIG_COMPUTE_SLICES = 7
"""Compute slices of a MIG-capable GPU."""

UNHEALTHY_TAINT = "unhealthy"
"""Taint key (under the driver's domain) of an unhealthy device."""

MAX_DEVICES = 128
"""Devices in one ResourceSlice."""
MAX_SHARED_COUNTERS = 32
"""Counters over all counter sets of one ResourceSlice."""
MAX_DEVICE_COUNTERS = 1024
"""Counters consumed by all devices of one ResourceSlice."""
COUNTERS_APART_MINOR = 35
"""From this Kubernetes minor on, counter sets are published in slices of their own (a slice
has `sharedCounters` or `devices`, not both), and the devices consume them across the pool."""
MAX_DEVICES_APART = 64
"""Devices in one ResourceSlice where counters are apart (the limit for a slice whose devices
have taints or consume counters)."""
MAX_COUNTER_SETS = 8
"""Counter sets in one ResourceSlice where counters are apart."""
_MAX_NAME = 253
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class _Unit:
    """Devices that stay in one slice: a counter set and every device consuming it."""

    devices: list[dict[str, Any]] = field(default_factory=list)
    counter_set: dict[str, Any] | None = None
    mig: bool = False

    @property
    def shared_counters(self) -> int:
        return len(self.counter_set["counters"]) if self.counter_set else 0

    @property
    def device_counters(self) -> int:
        return sum(len(c["counters"]) for d in self.devices for c in d.get("consumesCounters", ()))


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _int(value: int) -> dict[str, int]:
    return {"int": value}


def _taint_value(reason: str) -> str:
    """A health reason as a label value (the API's rule for taint values)."""
    value = _LABEL_VALUE_BAD.sub("-", reason)[:63].strip("-_.")
    return value or "unhealthy"


def _nvlink_domains(devices: Sequence[pb.Device]) -> dict[str, int]:
    """Device ID -> the lowest index of its NVLink-connected component."""
    by_id = {d.id: d for d in devices}
    domain: dict[str, int] = {}
    for start in sorted(devices, key=lambda d: d.index):
        if start.id in domain:
            continue
        stack = [start]
        while stack:
            device = stack.pop()
            if device.id in domain:
                continue
            domain[device.id] = start.index
            stack += [
                by_id[p.peer_id]
                for p in device.peers
                if p.kind == pb.INTERCONNECT_KIND_NVLINK and p.peer_id in by_id
            ]
    return domain


def _counter_set_name(device: pb.Device) -> str:
    return device_name(device)


def _counters(slices: int, memory: int) -> dict[str, dict[str, str]]:
    return {
        SLICES_COUNTER: {"value": format_quantity(slices)},
        MEMORY_COUNTER: {"value": format_quantity(memory)},
    }


def _tdm_capacity(device: pb.Device) -> dict[str, Any]:
    step = memory_step(device)
    return {
        CORES: {
            "value": format_quantity(WHOLE_CORES),
            "requestPolicy": {
                "default": format_quantity(WHOLE_CORES),
                "validRange": {"min": "0", "step": "1"},
            },
        },
        MEMORY: {
            # 100 steps of 1 % (naming.memory_step): the default must be a step multiple.
            "value": format_quantity(step * WHOLE_CORES),
            "requestPolicy": {
                "default": format_quantity(step * WHOLE_CORES),
                "validRange": {"min": "0", "step": format_quantity(step)},
            },
        },
    }


class _Builder:
    def __init__(self, devices: Sequence[pb.Device], driver: str, taints_supported: bool) -> None:
        self.driver = driver
        self.taints_supported = taints_supported
        self.domains = _nvlink_domains(devices)

    def _health(self, healthy: bool, reason: str, device: dict[str, Any]) -> bool:
        """Taint an unhealthy device; False when it must be left out instead."""
        if healthy:
            return True
        if not self.taints_supported:
            return False
        device["taints"] = [
            {
                "key": f"{self.driver}/{UNHEALTHY_TAINT}",
                "value": _taint_value(reason),
                "effect": "NoSchedule",
            }
        ]
        return True

    def _base_attributes(self, device: pb.Device) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            MODEL: _string(device.model),
            NUMA_NODE: _int(device.numa_node),
            NVLINK_DOMAIN: _int(self.domains[device.id]),
        }
        if device.pci_bus_id:
            attributes[PCI_BUS_ID] = _string(device.pci_bus_id)
        return attributes

    def unit(self, device: pb.Device) -> _Unit | None:
        """The published devices of one Runtime device; None when none is published."""
        kind = by_value(device.kind)
        if kind is None or device.mode == pb.DEVICE_MODE_UNSPECIFIED:
            return None
        healthy = device.health != pb.HEALTH_UNHEALTHY
        if device.mode == pb.DEVICE_MODE_MIG:
            return self._mig_unit(device, healthy) if kind.shareable else None
        tdm = device.mode == pb.DEVICE_MODE_TDM
        out: dict[str, Any] = {
            "name": device_name(device),
            "attributes": {
                TYPE: _string(kind.name),
                UUID: _string(device.id),
                INDEX: _int(device.index),
                MODE: _string(TDM_MODE if tdm else EXCLUSIVE_MODE),
                **self._base_attributes(device),
            },
            "capacity": {MEMORY: {"value": format_quantity(device.memory_bytes)}},
        }
        unit = _Unit([out])
        if kind.shareable and tdm:
            out["allowMultipleAllocations"] = True
            out["capacity"] = _tdm_capacity(device)
        elif kind.shareable:
            counters = _counters(MIG_COMPUTE_SLICES, device.memory_bytes)
            unit.counter_set = {"name": _counter_set_name(device), "counters": counters}
            out["consumesCounters"] = [
                {"counterSet": _counter_set_name(device), "counters": counters}
            ]
        if not self._health(healthy, device.health_reason, out):
            return None
        return unit

    def _mig_unit(self, device: pb.Device, healthy: bool) -> _Unit | None:
        unit = _Unit(mig=True)
        for instance in device.mig_instances:
            out: dict[str, Any] = {
                "name": mig_name(device, instance),
                "attributes": {
                    TYPE: _string(MIG_TYPE),
                    UUID: _string(instance.id),
                    INDEX: _int(instance.instance_id),
                    MODE: _string(MIG_TYPE),
                    PROFILE: _string(instance.profile),
                    PARENT_UUID: _string(device.id),
                    PARENT_INDEX: _int(device.index),
                    **self._base_attributes(device),
                },
                "capacity": {MEMORY: {"value": format_quantity(instance.memory_bytes)}},
                "consumesCounters": [
                    {
                        "counterSet": _counter_set_name(device),
                        "counters": _counters(instance.compute_slices, instance.memory_bytes),
                    }
                ],
            }
            instance_healthy = healthy and instance.health != pb.HEALTH_UNHEALTHY
            reason = device.health_reason if not healthy else "MIG instance unhealthy"
            if self._health(instance_healthy, reason, out):
                unit.devices.append(out)
        if not unit.devices:
            return None
        unit.counter_set = {
            "name": _counter_set_name(device),
            "counters": _counters(MIG_COMPUTE_SLICES, device.memory_bytes),
        }
        return unit


def counters_apart(minor: int) -> bool:
    """Whether a Kubernetes minor wants counter sets in slices of their own."""
    return minor >= COUNTERS_APART_MINOR


def _pack(units: Sequence[_Unit], *, apart: bool = False) -> list[list[_Unit]]:
    """Units in index order, into as few slices as the API limits allow (`apart`: the
    devices only, their counter sets published elsewhere)."""
    groups: list[list[_Unit]] = []
    for unit in units:
        group = groups[-1] if groups else []
        devices = sum(len(u.devices) for u in group) + len(unit.devices)
        fits = (
            devices <= MAX_DEVICES_APART
            if apart
            else devices <= MAX_DEVICES
            and sum(u.shared_counters for u in group) + unit.shared_counters <= MAX_SHARED_COUNTERS
            and sum(u.device_counters for u in group) + unit.device_counters <= MAX_DEVICE_COUNTERS
        )
        if not groups or not fits:
            groups.append([])
        groups[-1].append(unit)
    return groups


def slice_name(node_name: str, driver: str, number: int) -> str:
    """The name of slice `number` of a node's pool: `<node>-<driver>-<number>` (a hash of the
    node and driver instead when that would be too long for an object name)."""
    name = f"{node_name}-{driver}-{number}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(f"{node_name}/{driver}".encode()).hexdigest()[:16]
    return f"{node_name[: _MAX_NAME - 40]}-{digest}-{number}"


def build_slices(
    devices: Sequence[pb.Device],
    *,
    node_name: str,
    protocol: Protocol,
    generation: int,
    taints_supported: bool = True,
    node_uid: str | None = None,
    apart: bool = False,
) -> list[dict[str, Any]]:
    """The ResourceSlices of a node's pool at `generation`; owned by the Node when
    `node_uid` is given (deleting the node deletes them). `apart` (counters_apart of the
    server's minor): the counter sets in slices of their own, after the devices' slices."""
    driver = protocol.dra.driver
    builder = _Builder(devices, driver, taints_supported)
    units = [u for d in sorted(devices, key=lambda d: d.index) if (u := builder.unit(d))]
    groups = _pack([u for u in units if not u.mig], apart=apart) + _pack(
        [u for u in units if u.mig], apart=apart
    )
    contents: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
        (
            [d for u in g for d in u.devices],
            [] if apart else [u.counter_set for u in g if u.counter_set],
        )
        for g in groups
    ]
    if apart:
        sets = [u.counter_set for u in units if u.counter_set]
        contents += [
            ([], sets[i : i + MAX_COUNTER_SETS]) for i in range(0, len(sets), MAX_COUNTER_SETS)
        ]
    contents = contents or [([], [])]
    metadata_extra: dict[str, Any] = {}
    if node_uid:
        metadata_extra["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]
    slices: list[dict[str, Any]] = []
    for number, (slice_devices, counter_sets) in enumerate(contents):
        spec: dict[str, Any] = {
            "driver": driver,
            "nodeName": node_name,
            "pool": {
                "name": node_name,
                "generation": generation,
                "resourceSliceCount": len(contents),
            },
        }
        if counter_sets:
            spec["sharedCounters"] = counter_sets
        if slice_devices or not counter_sets:
            spec["devices"] = slice_devices
        slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name(node_name, driver, number), **metadata_extra},
                "spec": spec,
            }
        )
    return slices
