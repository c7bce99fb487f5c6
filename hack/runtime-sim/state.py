"""Mutable node state: device health, Runtime version, feature switch, watch fan-out."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from lj_runtimekit.proto.pkg.version import parse_version
from lj_runtimekit.runtimesim.inventory import DeviceInfo, MigInstanceInfo
from lj_runtimekit.runtimesim.node import NodeSpec

log = logging.getLogger(__name__)

EventType = Literal["snapshot", "modified"]
XID_REASON = re.compile(r"\bXID (\d+)\b")
"""How a health reason names an XID error (`XID 79`): only such a reason counts one."""


@dataclass(frozen=True)
class Health:
    """Health of a device or MIG instance."""

    healthy: bool
    reason: str = ""


HEALTHY = Health(True)


@dataclass(frozen=True)
class DeviceView:
    """A device with its current health and that of its MIG instances."""

    info: DeviceInfo
    health: Health
    mig_health: tuple[Health, ...]


@dataclass(frozen=True)
class InventoryEvent:
    """One event of the device watch stream."""

    type: EventType
    devices: tuple[DeviceView, ...]
    revision: int


@dataclass(frozen=True)
class FeatureState:
    """Whether the node's Runtime Kit features are on, and who changed that last."""

    enabled: bool
    changed_at_unix: int
    changed_by: str


class NodeState:
    """Everything about the simulated node that changes while it runs."""

    def __init__(self, node: NodeSpec, devices: tuple[DeviceInfo, ...], version: str) -> None:
        self.node_name = node.name
        self.devices = devices
        self._by_id = {d.id: d for d in devices}
        self._instances = {m.id: m for d in devices for m in d.mig_instances}
        self._health: dict[str, Health] = {}
        for spec, device in zip(node.devices, devices, strict=True):
            self._health[device.id] = Health(spec.healthy, spec.health_reason)
            for instance in device.mig_instances:
                self._health[instance.id] = HEALTHY
        self.xid_errors = dict.fromkeys(self._by_id, 0)
        self._version = str(parse_version(version, what="runtime version"))
        self._features = FeatureState(enabled=False, changed_at_unix=0, changed_by="")
        self._revision = 1
        self._watchers: set[asyncio.Queue[InventoryEvent]] = set()

    @property
    def version(self) -> str:
        """The Runtime version reported now, ``v{major}.{feature}.{iteration}``."""
        return self._version

    def set_version(self, version: str) -> str:
        """Change the reported version; raise ValueError when it is not a version."""
        self._version = str(parse_version(version, what="runtime version"))
        log.info("runtime version changed version=%s", self._version)
        return self._version

    @property
    def revision(self) -> int:
        """Monotonic revision of the inventory."""
        return self._revision

    def device(self, device_id: str) -> DeviceInfo | None:
        """The device with this ID, or None."""
        return self._by_id.get(device_id)

    def mig_instance(self, instance_id: str) -> MigInstanceInfo | None:
        """The MIG instance with this ID, or None."""
        return self._instances.get(instance_id)

    def health(self, device_id: str) -> Health:
        """Effective health of a device or MIG instance (an instance shares its parent's)."""
        instance = self._instances.get(device_id)
        if instance is not None:
            parent = self._health[instance.parent_id]
            if not parent.healthy:
                return parent
        return self._health[device_id]

    def view(self, device: DeviceInfo) -> DeviceView:
        """The device with its current health."""
        return DeviceView(
            info=device,
            health=self._health[device.id],
            mig_health=tuple(self.health(m.id) for m in device.mig_instances),
        )

    def views(self) -> tuple[DeviceView, ...]:
        """Every device with its current health, ordered by index."""
        return tuple(self.view(d) for d in self.devices)

    def set_health(self, device_id: str, healthy: bool, reason: str) -> bool:
        """Set the health of a device or MIG instance; return whether it changed.

        A device turning (or staying) unhealthy with a reason that names an XID code
        (`XID 79`) counts one XID error; other reasons (ECC, none) count none. Raises
        KeyError for an unknown ID.
        """
        if device_id not in self._health:
            raise KeyError(device_id)
        new = Health(True) if healthy else Health(False, reason or "marked unhealthy")
        if self._health[device_id] == new:
            return False
        self._health[device_id] = new
        instance = self._instances.get(device_id)
        parent = self._by_id[instance.parent_id] if instance else self._by_id[device_id]
        if not healthy and instance is None and XID_REASON.search(new.reason):
            # The XID's code is in the reason the Runtime reports (ListDevices, WatchDevices).
            self.xid_errors[device_id] += 1
        self._publish("modified", (self.view(parent),))
        log.info(
            "device health changed device=%s healthy=%s reason=%s", device_id, healthy, new.reason
        )
        return True

    async def watch(self) -> AsyncIterator[InventoryEvent]:
        """Yield a snapshot event, then one event per change, until cancelled."""
        queue: asyncio.Queue[InventoryEvent] = asyncio.Queue()
        self._watchers.add(queue)
        try:
            yield InventoryEvent("snapshot", self.views(), self._revision)
            while True:
                yield await queue.get()
        finally:
            self._watchers.discard(queue)

    def _publish(self, type_: EventType, devices: tuple[DeviceView, ...]) -> None:
        self._revision += 1
        event = InventoryEvent(type_, devices, self._revision)
        for queue in self._watchers:
            queue.put_nowait(event)

    @property
    def features(self) -> FeatureState:
        """The feature switch as it is now."""
        return self._features

    def set_features(self, enabled: bool, requester: str) -> bool:
        """Turn the features on or off; return False when they already were."""
        if self._features.enabled == enabled:
            return False
        self._features = FeatureState(enabled, int(time.time()), requester)
        log.info("node features changed enabled=%s requester=%s", enabled, requester)
        return True
