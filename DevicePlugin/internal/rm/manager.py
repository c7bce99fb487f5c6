"""Resource manager: the Runtime watch stream turned into the kubelet's device lists.

The manager keeps the last Runtime inventory, applies every watch event, and
wakes the ListAndWatch streams on each change. When the stream dies the
devices stay listed but go Unhealthy (the kubelet stops placing pods on them
without losing their allocations); the manager reconnects with a tenacity
bounded exponential backoff and the devices return to Healthy with the next
snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from lj_runtimekit.deviceplugin.internal.rm.resources import (
    Inventory,
    KubeletDevice,
    build_inventory,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg.featuregate import GateReport, RuntimeTooOldError
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.proto.pkg.runtimeclient import (
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.version import InvalidVersionError

log = logging.getLogger(__name__)


class RuntimeAccess:
    """The Runtime client for unary calls, with a fresh channel after each Runtime outage.

    gRPC channels back off for up to minutes after a lost connection; a new
    channel connects at once, so the manager calls `renew()` when the watch
    stream is back.
    """

    def __init__(self, socket_dir: str, socket_name: str, retry: RetryPolicy) -> None:
        self.socket_dir = socket_dir
        self.socket_name = socket_name
        self.retry = retry
        self.client = self.new_client()
        self._retired: set[asyncio.Task[None]] = set()

    def new_client(self) -> RuntimeClient:
        """A client on its own channel."""
        return RuntimeClient(self.socket_dir, self.socket_name, retry=self.retry)

    def renew(self) -> None:
        """Use a new channel from now on; the old one closes after its calls had time to end."""
        old, self.client = self.client, self.new_client()
        task = asyncio.create_task(self._close_later(old))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def _close_later(self, client: RuntimeClient) -> None:
        await asyncio.sleep(self.retry.call_timeout_s)
        await client.close()

    async def close(self) -> None:
        """Close every channel."""
        for task in list(self._retired):
            task.cancel()
        await asyncio.gather(*self._retired, return_exceptions=True)
        await self.client.close()


@dataclass(frozen=True)
class Snapshot:
    """What the manager knows at one generation."""

    generation: int
    runtime_up: bool
    devices: tuple[rpb.Device, ...]
    inventory: Inventory
    runtime_version: str
    _index: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    def ids(self, resource: str) -> frozenset[str]:
        """The kubelet IDs of a resource (computed once per snapshot)."""
        key = f"ids/{resource}"
        if key not in self._index:
            devices = self.inventory.resources.get(resource, ())
            self._index[key] = frozenset(d.id for d in devices)
        found = self._index[key]
        assert isinstance(found, frozenset)
        return found

    def units(self, resource: str, device_id: str) -> tuple[str, ...]:
        """The kubelet IDs of a resource that stand for one physical device."""
        key = f"units/{resource}"
        if key not in self._index:
            by_device: dict[str, list[str]] = {}
            for d in self.inventory.resources.get(resource, ()):
                by_device.setdefault(d.device_id, []).append(d.id)
            self._index[key] = {k: tuple(v) for k, v in by_device.items()}
        found = self._index[key]
        assert isinstance(found, dict)
        units: tuple[str, ...] = found.get(device_id, ())
        return units

    def device(self, device_id: str) -> rpb.Device | None:
        """The Runtime's description of a physical device."""
        if "devices" not in self._index:
            self._index["devices"] = {d.id: d for d in self.devices}
        found = self._index["devices"]
        assert isinstance(found, dict)
        dev: rpb.Device | None = found.get(device_id)
        return dev


class _StreamLost(Exception):
    """The watch stream ended before its first event (counts as a failed attempt)."""


class ResourceManager:
    """Devices per resource, kept current from the Runtime's WatchDevices stream."""

    def __init__(
        self,
        runtime: RuntimeAccess,
        protocol: Protocol,
        gates: GateReport,
        devices: tuple[rpb.Device, ...],
        *,
        gates_for: Callable[[str], GateReport] | None = None,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
    ) -> None:
        self._runtime = runtime
        self._protocol = protocol
        self._gates = gates
        self._gates_for = gates_for
        self._too_old = False
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._changed = asyncio.Condition()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._snapshot = self._make(1, True, devices)
        self._logged_skips: set[str] = set()
        self._log_skips(self._snapshot.inventory)

    def _make(self, generation: int, up: bool, devices: tuple[rpb.Device, ...]) -> Snapshot:
        usable = up and not self._too_old
        inventory = build_inventory(devices, self._protocol, self._gates, runtime_up=usable)
        return Snapshot(generation, up, devices, inventory, str(self._gates.runtime_version))

    async def _check_version(self, client: RuntimeClient) -> None:
        """After an outage: re-evaluate the feature gates when the Runtime's version changed."""
        if self._gates_for is None:
            return
        try:
            info = await client.runtime_info()
            gates = self._gates_for(info.version)
        except InvalidVersionError as exc:
            log.error(
                "runtime reports a bad version, keeping the gates", extra={"reason": str(exc)}
            )
            return
        if gates.runtime_version == self._gates.runtime_version:
            return
        log.warning(
            "runtime version changed",
            extra={"from": self._gates.runtime_version, "to": gates.runtime_version},
        )
        self._gates = gates
        try:
            gates.require_base()
        except RuntimeTooOldError as exc:
            self._too_old = True
            log.error("devices unhealthy until the Runtime is upgraded", extra={"reason": str(exc)})
            return
        self._too_old = False
        for message in gates.messages:
            log.warning("feature gate", extra={"detail": message})

    def _log_skips(self, inventory: Inventory) -> None:
        for line in inventory.skipped:
            if line not in self._logged_skips:
                self._logged_skips.add(line)
                log.warning("device not offered", extra={"reason": line})

    @property
    def snapshot(self) -> Snapshot:
        """The current state."""
        return self._snapshot

    def resources(self) -> Mapping[str, tuple[KubeletDevice, ...]]:
        """Resource name -> devices, as listed to the kubelet now."""
        return self._snapshot.inventory.resources

    def device(self, device_id: str) -> rpb.Device | None:
        """The Runtime's description of a physical device."""
        return self._snapshot.device(device_id)

    def add_listener(self, listener: Callable[[Snapshot], None]) -> None:
        """Call `listener` with every new snapshot (after the ListAndWatch wake-up)."""
        self._listeners.append(listener)

    async def wait_changed(self, seen: int) -> Snapshot:
        """Wait until the generation is past `seen` and return the new snapshot."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._snapshot.generation > seen)
            return self._snapshot

    async def _publish(self, up: bool, devices: tuple[rpb.Device, ...]) -> None:
        snap = self._make(self._snapshot.generation + 1, up, devices)
        async with self._changed:
            self._snapshot = snap
            self._changed.notify_all()
        self._log_skips(snap.inventory)
        for listener in self._listeners:
            listener(snap)

    async def run(self) -> None:
        """Follow the watch stream forever, reconnecting with bounded backoff."""
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(
                    (RuntimeUnavailableError, RuntimeCallError, _StreamLost)
                ),
                wait=wait_exponential(multiplier=self._initial_backoff_s, max=self._max_backoff_s),
                before_sleep=self._before_retry,
            )
            async for attempt in retrying:
                with attempt:
                    await self._follow()

    def _before_retry(self, state: object) -> None:
        attempt = getattr(state, "attempt_number", 0)
        if attempt in (1, 10) or attempt % 50 == 0:
            log.warning(
                "runtime watch unavailable",
                extra={"socket": self._runtime.client.socket_path, "attempt": attempt},
            )

    async def _follow(self) -> None:
        """One watch stream; returns when a stream that delivered events ends."""
        client = self._runtime.new_client()
        got_event = False
        try:
            async for event in client.watch_devices():
                if not got_event:
                    got_event = True
                    if not self._snapshot.runtime_up:
                        log.info("runtime back", extra={"socket": client.socket_path})
                        self._runtime.renew()
                        await self._check_version(client)
                await self._apply(event)
        except (RuntimeUnavailableError, RuntimeCallError) as exc:
            if not got_event:
                await self._mark_down(str(exc))
                raise
            await self._mark_down(str(exc))
            return
        finally:
            await client.close()
        if not got_event:
            await self._mark_down("watch stream ended without events")
            raise _StreamLost
        await self._mark_down("watch stream ended")

    async def _mark_down(self, reason: str) -> None:
        if self._snapshot.runtime_up:
            log.warning(
                "runtime lost, devices unhealthy until it returns", extra={"reason": reason}
            )
            await self._publish(False, self._snapshot.devices)

    async def _apply(self, event: rpb.DeviceEvent) -> None:
        devices = {d.id: d for d in self._snapshot.devices}
        if event.type == rpb.DeviceEvent.TYPE_SNAPSHOT:
            new = tuple(event.devices)
        else:
            for dev in event.devices:
                if event.type == rpb.DeviceEvent.TYPE_REMOVED:
                    devices.pop(dev.id, None)
                else:
                    devices[dev.id] = dev
            new = tuple(sorted(devices.values(), key=lambda d: d.index))
        for dev in event.devices:
            if event.type != rpb.DeviceEvent.TYPE_SNAPSHOT:
                log.info(
                    "device changed",
                    extra={
                        "device": dev.id,
                        "event": rpb.DeviceEvent.Type.Name(event.type),
                        "health": rpb.Health.Name(dev.health),
                        "reason": dev.health_reason,
                    },
                )
        if new != self._snapshot.devices or not self._snapshot.runtime_up:
            await self._publish(True, new)
