"""How the Runtime's devices are named in ResourceSlices, and what an allocated share means.

One place for the mapping both ways: the slice publisher names devices with it, and
NodePrepareResources reads an allocation's device name and consumed capacity back into the
Runtime's device ID and core/memory percentages.

- A device (whole, TDM or exclusive mode) is `<kind>-<index>`, e.g. `gpu-3`.
- A MIG instance is `<kind>-<index>-mig-<instance id>`, e.g. `gpu-3-mig-9`.
- A TDM-mode device allows multiple allocations and has two consumable capacities:
  `cores` (100 per device, step 1: a core percentage) and `memory` (bytes, step 1 % of the
  device's memory, rounded up; 100 steps in all). A request without capacity gets both
  defaults, the whole device.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.devicekind import name_of
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.proto.pkg.quantity import QuantityError, parse_quantity

CORES = "cores"
"""Consumable capacity of a TDM device: core percentage, 100 per device."""
MEMORY = "memory"
"""Consumable capacity of a TDM device: memory bytes, consumed in steps of 1 %."""
WHOLE_CORES = 100

_MIG_RE = re.compile(r"^(?P<device>[a-z0-9]+-\d+)-mig-(?P<instance>\d+)$")


class ShareError(ValueError):
    """An allocated device or capacity that the Runtime cannot serve; the message says why."""


def device_name(device: pb.Device) -> str:
    """The ResourceSlice name of a device: `<kind>-<index>`."""
    return f"{name_of(device.kind)}-{device.index}"


def mig_name(device: pb.Device, instance: pb.MigInstance) -> str:
    """The ResourceSlice name of a MIG instance: `<kind>-<index>-mig-<instance id>`."""
    return f"{device_name(device)}-mig-{instance.instance_id}"


def memory_step(device: pb.Device) -> int:
    """Bytes of 1 % of the device's memory, rounded up (at least 1): a request of a quarter
    of the memory in bytes is then 25 steps, not 26. A TDM device's `memory` capacity is
    100 steps (at most 99 bytes above the device's memory): the memory as the Runtime
    shares it."""
    return max(1, -(-device.memory_bytes // 100))


@dataclass(frozen=True)
class DeviceRef:
    """A published device name resolved against the Runtime's inventory."""

    device: pb.Device
    instance: pb.MigInstance | None = None

    @property
    def runtime_id(self) -> str:
        """The ID the Runtime allocates: the MIG instance's, else the device's."""
        return self.instance.id if self.instance is not None else self.device.id


def resolve(devices: Sequence[pb.Device], name: str) -> DeviceRef | None:
    """The device or MIG instance a published name stands for; None when the inventory has
    no such device (gone, or the name was never ours)."""
    match = _MIG_RE.match(name)
    base = match.group("device") if match else name
    for device in devices:
        if device_name(device) != base:
            continue
        if match is None:
            return DeviceRef(device)
        instance_id = int(match.group("instance"))
        for instance in device.mig_instances:
            if instance.instance_id == instance_id:
                return DeviceRef(device, instance)
        return None
    return None


def _quantity(consumed: Mapping[str, str], key: str, device: str) -> Decimal | None:
    if key not in consumed:
        return None
    try:
        value = parse_quantity(consumed[key])
    except QuantityError as exc:
        raise ShareError(
            f"device {device}: consumed capacity {key}={consumed[key]!r}: {exc}"
        ) from exc
    if value < 0:
        raise ShareError(f"device {device}: consumed capacity {key}={consumed[key]!r} is negative")
    return value


def share_of(ref: DeviceRef, consumed: Mapping[str, str] | None) -> DeviceShare:
    """The share an allocation result stands for: the whole device (or MIG instance) when
    no capacity was consumed or all of it was; else a TDM slice in percent (memory rounded
    up to the Runtime's 1 % granularity). Refuses capacity on a device that is not shared,
    more than the device has, or a slice of nothing."""
    name = mig_name(ref.device, ref.instance) if ref.instance else device_name(ref.device)
    if not consumed:
        return DeviceShare(ref.runtime_id)
    if ref.instance is not None or ref.device.mode != pb.DEVICE_MODE_TDM:
        raise ShareError(
            f"device {name} is not shared (TDM) but the allocation consumes capacity"
            f" {dict(consumed)}"
        )
    unknown = sorted(set(consumed) - {CORES, MEMORY})
    if unknown:
        raise ShareError(f"device {name}: unknown consumed capacity {', '.join(unknown)}")
    cores = _quantity(consumed, CORES, name)
    memory = _quantity(consumed, MEMORY, name)
    core_percent = WHOLE_CORES if cores is None else math.ceil(cores)
    memory_percent = WHOLE_CORES if memory is None else math.ceil(memory / memory_step(ref.device))
    if core_percent > WHOLE_CORES or memory_percent > WHOLE_CORES:
        raise ShareError(
            f"device {name}: consumed {dict(consumed)} is more than the device has"
            f" ({WHOLE_CORES} cores, {ref.device.memory_bytes} bytes of memory)"
        )
    if core_percent == 0 and memory_percent == 0:
        raise ShareError(
            f"device {name}: a slice of 0 cores and 0 memory is no share; ask for at least one"
        )
    if core_percent == WHOLE_CORES and memory_percent == WHOLE_CORES:
        return DeviceShare(ref.runtime_id)
    return DeviceShare(ref.runtime_id, core_percent, memory_percent)
