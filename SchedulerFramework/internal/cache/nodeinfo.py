"""NodeInfo: one node's schedulable state, precomputed once per node update."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import (
    ADMISSION_KUBELET_ORDER,
    DRA_MODE,
    InventoryError,
    Protocol,
    decode_inventory,
)
from lj_runtimekit.proto.pkg.quantity import QuantityError
from lj_runtimekit.schedulerframework.internal.cache.devices import (
    DeviceState,
    NodeDevices,
    devices_from_capacity,
    devices_from_inventory,
)
from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    KubeObject,
    resource_amount,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeOwnership:
    """One owner per node: a node whose `label` names a scheduler is placed on only by the
    process running that profile, so two scheduler processes never share a device."""

    label: str
    profiles: frozenset[str]
    """The scheduler names of this process's profiles."""
    required: bool = False
    """True: a node without the label is placed on by none of them."""

    def refusal(self, labels: Mapping[str, str]) -> str:
        """Why this process must not place pods on a node with `labels`; "" when it may."""
        owner = labels.get(self.label)
        if owner is None:
            if self.required:
                return f"node has no owner (label {self.label}; requireNodeOwner is set)"
            return ""
        if owner in self.profiles:
            return ""
        return f"node owned by scheduler {owner} (label {self.label})"


def whole_kinds(protocol: Protocol) -> dict[str, str]:
    """Whole-device resource name -> device kind name (the device-kind table)."""
    return {
        name: kind.name for name, kind in devicekind.whole_resources(protocol.resources).items()
    }


class NodeInfo:
    """A node: labels, taints, allocatable, what its pods request, and its devices."""

    __slots__ = (
        "allocatable",
        "device_source",
        "devices",
        "dra",
        "foreign",
        "inventory_error",
        "labels",
        "name",
        "obj",
        "pods",
        "requested",
        "serial_admission",
        "soft_taints",
        "taints",
        "unschedulable",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.obj: KubeObject = {}
        self.labels: Mapping[str, str] = {}
        self.taints: tuple[Taint, ...] = ()
        """NoSchedule and NoExecute taints (Filter)."""
        self.soft_taints: tuple[Taint, ...] = ()
        """PreferNoSchedule taints (Score)."""
        self.unschedulable = False
        self.allocatable: dict[str, int] = {}
        self.requested: dict[str, int] = {}
        self.pods: set[str] = set()
        self.devices = NodeDevices([], from_inventory=False)
        self.inventory_error = ""
        self.device_source: tuple[object, ...] = ()
        self.foreign = ""
        """Why another scheduler owns the node (NodeOwnership); "" when this process may
        place pods on it. Such a node carries a NoSchedule taint saying so (its key is no
        valid taint key, so only a pod tolerating every taint passes it), and its devices
        are offered to nobody (held as unhealthy; the pods on them are still counted)."""
        self.dra = False
        """The node serves its devices through DRA (`labels.device_api` = `dra`), not the
        Device Plugin: it offers no device here, whatever inventory annotation it still
        carries from before it was switched."""
        self.serial_admission = True
        """The node's Device Plugin needs its device pods bound one at a time (it says
        otherwise in `annotations.node_admission`; docs/protocol.md)."""

    @property
    def present(self) -> bool:
        """False for a placeholder holding pods of a node the cache has not seen (yet)."""
        return bool(self.obj)

    def update(
        self, obj: KubeObject, protocol: Protocol, ownership: NodeOwnership | None = None
    ) -> None:
        """Refresh from a Node object (labels, taints, allocatable, device inventory)."""
        self.obj = obj
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        self.labels = meta.get("labels") or {}
        self.dra = self.labels.get(protocol.labels.device_api) == DRA_MODE
        taints = [
            Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in spec.get("taints") or ()
            if isinstance(t, dict)
        ]
        self.foreign = ownership.refusal(self.labels) if ownership is not None else ""
        if self.foreign:
            # the key no real taint can have: only a pod tolerating every taint ignores it
            taints.append(Taint(self.foreign, "", "NoSchedule"))
        self.taints = tuple(t for t in taints if t.effect in ("NoSchedule", "NoExecute"))
        self.soft_taints = tuple(t for t in taints if t.effect == "PreferNoSchedule")
        self.unschedulable = bool(spec.get("unschedulable"))
        alloc: dict[str, int] = {}
        for name, value in (status.get("allocatable") or {}).items():
            try:
                alloc[name] = resource_amount(name, value)
            except QuantityError:
                log.warning("node has an unparsable allocatable %s=%r", name, value)
        self.allocatable = alloc
        annotations = meta.get("annotations") or {}
        mode = annotations.get(protocol.annotations.node_admission)
        self.serial_admission = mode != ADMISSION_KUBELET_ORDER
        self._update_devices(annotations, protocol)

    def _update_devices(self, annotations: Mapping[str, str], protocol: Protocol) -> None:
        text = annotations.get(protocol.annotations.node_devices)
        kinds = whole_kinds(protocol)
        source = (text, self.foreign, self.dra, *(self.allocatable.get(r, 0) for r in kinds))
        if source == self.device_source:
            return
        self.device_source = source
        self.inventory_error = ""
        devices, from_inventory = self._devices(text, kinds, protocol)
        if self.foreign:
            for dev in devices:
                dev.healthy = False
        self.devices.replace_devices(devices, from_inventory)

    def _devices(
        self, text: str | None, kinds: Mapping[str, str], protocol: Protocol
    ) -> tuple[list[DeviceState], bool]:
        """The device table from the inventory annotation, else from the allocatable; none
        on a DRA node."""
        if self.dra:
            return [], False
        if text is not None:
            try:
                inventory = decode_inventory(text)
            except InventoryError as exc:
                self.inventory_error = (
                    f"annotation {protocol.annotations.node_devices}: {exc}; "
                    "falling back to the node's capacity"
                )
                log.warning(
                    "node device inventory unusable: %s",
                    self.inventory_error,
                    extra={"node": self.name},
                )
            else:
                return devices_from_inventory(inventory), True
        devices = []
        for resource, kind in kinds.items():
            count = self.allocatable.get(resource, 0)
            if count:
                devices.extend(devices_from_capacity(count, kind))
        for i, dev in enumerate(devices):  # ids stay unique across kinds
            dev.index = i
            if dev.kind != "gpu":
                dev.id = f"{dev.kind}-{dev.id}"
        return devices, False

    def add_requests(self, requests: Mapping[str, int], sign: int) -> None:
        req = self.requested
        for name, value in requests.items():
            req[name] = req.get(name, 0) + sign * value
