"""Publishes the Runtime's inventory of a node as its ResourceSlice pool and keeps it current.

On start the publisher adopts the slices of its node and driver already on the API server
and publishes above their pool generation; afterwards each change of the inventory's
content (devices, modes, health) bumps the generation of every slice of the pool, extra
slices are deleted, and unchanged content is not written again. The Runtime is followed
with ListDevices, then WatchDevices, reconnecting with bounded backoff (tenacity) when it
restarts; the slices stay as they are while it is away.

The pool's slices are watched too (an informer): when someone else deletes or changes one
(the kubelet deletes its node's slices when it starts), or adds one to the pool, the
publisher adopts the pool again and republishes the last inventory above the highest
generation seen. A writer that keeps changing the pool is logged and answered with
bounded backoff, never at once again and again. `inventory` is the Runtime's
devices as last seen; `on_reconnect` is awaited each time ListDevices answers again after
the first time (the Runtime came back, or publishing was interrupted), before the slices
are synced.

The API server drops the fields of a DRA feature gate that is off; the publisher compares
what it wrote with what was stored, logs the missing gate once and reports it
(`missing_gates`). Without device taints, unhealthy devices are left out instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from lj_runtimekit.deviceplugin.internal.dra.slices import build_slices, counters_apart
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import (
    Informer,
    KubeClient,
    KubeError,
    KubeObject,
    NotFoundError,
    RetryPolicy,
)
from lj_runtimekit.proto.pkg.kube import call_async as kube_call
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.proto.pkg.runtimeclient import (
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)

log = logging.getLogger(__name__)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
DEVICE_TAINTS = "DRADeviceTaints"
REPEAT_WINDOW_S = 60.0
"""A change of the pool by someone else this soon after the last one is a repeat: the
pool is published again only after a backoff that grows with the repeats."""


class _StreamEnded(Exception):
    """The Runtime's watch ended before its first event."""


def server_minor(version: Mapping[str, Any]) -> int:
    """The minor of the API server's /version answer ("37", or "37+" from some vendors)."""
    digits = re.match(r"\d+", str(version.get("minor", "")))
    if digits is None:
        raise KubeError("GET /version", 200, f"no minor in {dict(version)}")
    return int(digits.group())


def dropped_gates(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> set[str]:
    """The DRA feature gates whose fields the API server dropped from a slice it stored."""
    missing: set[str] = set()
    if sent["spec"].get("sharedCounters") and not stored["spec"].get("sharedCounters"):
        missing.add(PARTITIONABLE_DEVICES)
    stored_devices = {d["name"]: d for d in stored["spec"].get("devices") or ()}
    for device in sent["spec"].get("devices") or ():
        kept = stored_devices.get(device["name"], {})
        for key, gate in (
            ("allowMultipleAllocations", CONSUMABLE_CAPACITY),
            ("consumesCounters", PARTITIONABLE_DEVICES),
            ("taints", DEVICE_TAINTS),
        ):
            if device.get(key) and not kept.get(key):
                missing.add(gate)
    return missing


def _content(slices: Iterable[Mapping[str, Any]]) -> list[Any]:
    """The slices without their pool generation: what a change of content is measured by."""
    return [
        (s["metadata"], {**s["spec"], "pool": {**s["spec"]["pool"], "generation": None}})
        for s in slices
    ]


def apply_event(devices: Mapping[str, pb.Device], event: pb.DeviceEvent) -> dict[str, pb.Device]:
    """The inventory by Runtime ID after one WatchDevices event."""
    if event.type == pb.DeviceEvent.TYPE_SNAPSHOT:
        return {d.id: d for d in event.devices}
    out = dict(devices)
    for device in event.devices:
        if event.type == pb.DeviceEvent.TYPE_REMOVED:
            out.pop(device.id, None)
        else:
            out[device.id] = device
    return out


class SlicePublisher:
    """The ResourceSlice pool of one node and one driver, kept equal to the Runtime's
    inventory (see the module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        runtime: RuntimeClient,
        protocol: Protocol,
        node_name: str,
        *,
        kube_retry: RetryPolicy | None = None,
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._kube = kube
        self._runtime = runtime
        self._protocol = protocol
        self._node = node_name
        self._kube_retry = kube_retry or RetryPolicy()
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._on_reconnect = on_reconnect
        self._inventory: tuple[pb.Device, ...] | None = None
        self._generation = 0
        self._seen_generation = 0
        """The highest pool generation the watch of the pool has seen."""
        self._published: list[Any] | None = None
        """Content of the pool as last written; None: unknown (adopt the server's first)."""
        self._names: set[str] = set()
        self._versions: dict[str, str] = {}
        """resourceVersion of each slice as last written (by name)."""
        self._lock = asyncio.Lock()
        """Held while the pool is written or compared with the server."""
        self._changed = asyncio.Event()
        """Set when the watch of the pool saw a slice we did not write."""
        self._repeats = 0
        self._last_foreign = -float("inf")
        self._node_uid: str | None = None
        self._apart = False
        """Counter sets in slices of their own (the API server is 1.35 or later)."""
        self._missing: set[str] = set()

    @property
    def generation(self) -> int:
        """The pool generation last published (0: nothing yet)."""
        return self._generation

    def inventory(self) -> tuple[pb.Device, ...] | None:
        """The Runtime's devices as last seen (ListDevices, then each watch event); None
        until ListDevices first answered."""
        return self._inventory

    @property
    def missing_gates(self) -> tuple[str, ...]:
        """The DRA feature gates the API server was found without, sorted."""
        return tuple(sorted(self._missing))

    def _selector(self) -> dict[str, str]:
        return {
            "fieldSelector": f"spec.nodeName={self._node},spec.driver={self._protocol.dra.driver}"
        }

    async def _call(self, what: str, method: str, path: str, body: object = None) -> Any:
        return await kube_call(
            what, lambda: self._kube.request(method, path, body), self._kube_retry
        )

    async def _list(self) -> list[dict[str, Any]]:
        items, _ = await kube_call(
            "list ResourceSlices",
            lambda: self._kube.list_all(SLICES, self._selector()),
            self._kube_retry,
        )
        return items

    async def run(self) -> None:
        """Publish, follow the Runtime and guard the pool until cancelled, retrying with
        bounded backoff."""
        loop = asyncio.get_running_loop()

        def on_slice(etype: str, obj: KubeObject) -> None:  # in the informer's thread
            loop.call_soon_threadsafe(self._on_slice, etype, obj)

        informer = Informer(
            self._kube,
            SLICES,
            on_slice,
            f"resourceslices-{self._node}",
            params=self._selector(),
            initial_backoff_s=self._initial_backoff_s,
            max_backoff_s=self._max_backoff_s,
        )
        informer.start()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._publish())
                tasks.create_task(self._guard())
        finally:
            informer.stop()

    def _retrying(self, *errors: type[Exception]) -> AsyncRetrying:
        """Tries that wait with bounded backoff after `errors`."""
        return AsyncRetrying(
            retry=retry_if_exception_type(errors),
            wait=wait_exponential(multiplier=self._initial_backoff_s, max=self._max_backoff_s),
            before_sleep=self._before_retry,
        )

    async def _publish(self) -> None:
        """Follow the Runtime and publish its inventory, for ever."""
        while True:
            retrying = self._retrying(
                RuntimeUnavailableError, RuntimeCallError, KubeError, _StreamEnded
            )
            async for attempt in retrying:
                with attempt:
                    await self._follow()

    def _before_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if state.attempt_number in (1, 10) or state.attempt_number % 50 == 0:
            log.warning(
                "slice publishing interrupted, retrying",
                extra={"node": self._node, "attempt": state.attempt_number, "error": str(error)},
            )
        if isinstance(error, KubeError):
            self._published = None  # the server's state is unknown: adopt it again

    async def _follow(self) -> None:
        """List and publish, then one watch stream; returns when a stream that delivered
        events ends."""
        try:
            devices = {d.id: d for d in await self._runtime.list_devices()}
            log.info("following the Runtime", extra={"node": self._node, "devices": len(devices)})
            again = self._inventory is not None
            self._inventory = tuple(devices.values())
            if again:
                await self._reconnected()
            await self._sync(self._inventory)
            got_event = False
            async with contextlib.aclosing(self._runtime.watch_devices()) as events:
                async for event in events:
                    got_event = True
                    devices = apply_event(devices, event)
                    self._inventory = tuple(devices.values())
                    await self._sync(self._inventory)
        except (RuntimeUnavailableError, RuntimeCallError):
            await self._runtime.close()
            raise
        if not got_event:
            raise _StreamEnded(f"Runtime watch on {self._runtime.socket_path} ended at once")
        log.info("runtime watch ended, reconnecting", extra={"node": self._node})

    async def _reconnected(self) -> None:
        """Await `on_reconnect`; its failure is logged and publishing goes on."""
        if self._on_reconnect is None:
            return
        try:
            await self._on_reconnect()
        except Exception as exc:
            log.warning(
                "on_reconnect failed, publishing goes on",
                extra={"node": self._node, "error": str(exc) or type(exc).__name__},
            )

    def _on_slice(self, etype: str, obj: KubeObject) -> None:
        """A watch event of the pool (on the loop): wake the guard unless it is our write."""
        meta = obj.get("metadata") or {}
        pool = (obj.get("spec") or {}).get("pool") or {}
        self._seen_generation = max(self._seen_generation, int(pool.get("generation") or 0))
        name = str(meta.get("name"))
        if etype == "DELETED":
            foreign = name in self._versions
        else:
            foreign = self._versions.get(name) != meta.get("resourceVersion")
        if foreign:
            self._changed.set()

    async def _guard(self) -> None:
        """Publish the pool again each time the watch saw it changed by someone else."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            async for attempt in self._retrying(KubeError):
                with attempt:
                    await self._restore()

    async def _restore(self) -> None:
        """Compare the pool on the server with what was written; when someone else changed
        it, adopt it and publish the last inventory again (after a backoff when that keeps
        happening)."""
        async with self._lock:
            if self._published is not None:
                stored = {
                    s["metadata"]["name"]: s["metadata"]["resourceVersion"]
                    for s in await self._list()
                }
                if stored == self._versions:
                    return
                self._published = None
                now = asyncio.get_running_loop().time()
                recent = now - self._last_foreign < REPEAT_WINDOW_S
                self._repeats = self._repeats + 1 if recent else 0
                self._last_foreign = now
                wait_s = (
                    min(self._initial_backoff_s * 2**self._repeats, self._max_backoff_s)
                    if self._repeats
                    else 0.0
                )
                log.warning(
                    "ResourceSlices of the pool changed by someone else, publishing them again",
                    extra={
                        "node": self._node,
                        "slices": sorted(
                            n
                            for n in set(stored) | set(self._versions)
                            if stored.get(n) != self._versions.get(n)
                        ),
                        "repeats": self._repeats,
                        "wait_s": round(wait_s, 2),
                    },
                )
            else:
                wait_s = 0.0
        await asyncio.sleep(wait_s)
        if self._inventory is not None:
            await self._sync(self._inventory)

    async def _adopt(self) -> None:
        """Take over the pool on the server: its slices and generation, and the node's UID."""
        existing = await self._list()
        self._names = {s["metadata"]["name"] for s in existing}
        self._versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in existing}
        self._generation = max(
            [
                self._generation,
                self._seen_generation,
                *(s["spec"]["pool"]["generation"] for s in existing),
            ]
        )
        try:
            node = await self._call("get Node", "GET", f"/api/v1/nodes/{self._node}")
            self._node_uid = node["metadata"]["uid"]
        except NotFoundError:
            self._node_uid = None
        version = await self._call("get the API server's version", "GET", "/version")
        self._apart = counters_apart(server_minor(version))
        log.info(
            "adopted ResourceSlices",
            extra={"node": self._node, "slices": len(existing), "generation": self._generation},
        )

    def _build(self, devices: Iterable[pb.Device], generation: int) -> list[dict[str, Any]]:
        return build_slices(
            sorted(devices, key=lambda d: d.index),
            node_name=self._node,
            protocol=self._protocol,
            generation=generation,
            taints_supported=DEVICE_TAINTS not in self._missing,
            apart=self._apart,
            node_uid=self._node_uid,
        )

    async def _sync(self, devices: Iterable[pb.Device]) -> None:
        """Publish the pool of `devices` unless its content is what was last written."""
        devices = list(devices)
        async with self._lock:
            if self._published is None:
                await self._adopt()
            while True:
                slices = self._build(devices, self._generation + 1)
                if _content(slices) == self._published:
                    return
                taints = DEVICE_TAINTS in self._missing
                await self._write(slices)
                if (DEVICE_TAINTS in self._missing) == taints:
                    return
                # Written with taints the server dropped: publish again without the unhealthy.

    async def _write(self, slices: Sequence[dict[str, Any]]) -> None:
        generation = slices[0]["spec"]["pool"]["generation"]
        for obj in slices:
            name = obj["metadata"]["name"]
            if name in self._names:
                stored = await self._call("update ResourceSlice", "PUT", f"{SLICES}/{name}", obj)
            else:
                stored = await self._call("create ResourceSlice", "POST", SLICES, obj)
                self._names.add(name)
            self._versions[name] = stored["metadata"]["resourceVersion"]
            for gate in sorted(dropped_gates(obj, stored) - self._missing):
                self._missing.add(gate)
                log.warning(
                    "the API server dropped fields of a DRA feature gate; turn it on in"
                    " kube-apiserver and kube-scheduler",
                    extra={"gate": gate, "node": self._node, "slice": name},
                )
        wanted = {s["metadata"]["name"] for s in slices}
        for name in sorted(self._names - wanted):
            await self._delete(name)
        self._published = _content(slices)
        self._generation = generation
        log.info(
            "published ResourceSlices",
            extra={
                "node": self._node,
                "generation": generation,
                "slices": len(slices),
                "devices": sum(len(s["spec"].get("devices") or ()) for s in slices),
            },
        )

    async def _delete(self, name: str) -> None:
        self._versions.pop(name, None)
        with contextlib.suppress(NotFoundError):
            await self._call("delete ResourceSlice", "DELETE", f"{SLICES}/{name}")
        self._names.discard(name)

    async def remove(self) -> None:
        """Delete this node's slices of our driver (the pool is gone until published again);
        call it after `run` is cancelled."""
        for obj in await self._list():
            await self._delete(obj["metadata"]["name"])
        self._names.clear()
        self._versions.clear()
        self._published = None
        log.info("removed ResourceSlices", extra={"node": self._node})
