"""Allocate and GetPreferredAllocation: pod by identity, the Runtime's injection spec, records.

State (the ledger: container key -> what it holds and which resources the
kubelet already asked for) is rebuilt at start from the Runtime's
ListAllocations and the pods' `annotations.allocated_devices`, so a restart
of the plugin never hands out an assignment twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from typing import Protocol as TypingProtocol

import grpc

from lj_runtimekit.deviceplugin.internal.allocate.resolve import (
    Candidate,
    DoneKey,
    candidates,
    choose,
    same_devices,
)
from lj_runtimekit.deviceplugin.internal.allocate.topology import best_set
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import NodePods, PodInfo, PodLookupError
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager, RuntimeAccess
from lj_runtimekit.deviceplugin.internal.rm.resources import (
    SLICE_UNITS,
    ResourceInfo,
    ResourceKind,
    resource_info,
    slice_unit_device,
)
from lj_runtimekit.deviceplugin.pkg.configpb import api_pb2
from lj_runtimekit.deviceplugin.pkg.configpb import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg.protocol import (
    AssignmentError,
    DeviceShare,
    Protocol,
    decode_assignment,
    encode_assignment,
)
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeCallError, RuntimeUnavailableError

log = logging.getLogger(__name__)

_PASSED_THROUGH = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
}


BIND_PHASE_ALLOCATED = "allocated"
"""`annotations.bind_phase` once every device container of the pod is allocated."""


class PodRecorder(TypingProtocol):
    """Writes records on pods (Kubernetes API; absent without access)."""

    def submit(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge these annotations onto the pod soon, newest record winning."""

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for writes in flight."""


@dataclass
class Held:
    """One container's allocation as the plugin knows it."""

    key: str
    pod_uid: str
    namespace: str
    name: str
    container: str
    shares: tuple[DeviceShare, ...]
    called: set[str] = field(default_factory=set)
    """Resources the kubelet already asked for (all implied ones after a rebuild)."""
    missing_since: float | None = None


def normalize(share: DeviceShare) -> DeviceShare:
    """100/100 and 0/0 both mean the whole device; keep one spelling (0/0)."""
    core = 0 if share.core_percent in (0, SLICE_UNITS) else share.core_percent
    memory = 0 if share.memory_percent in (0, SLICE_UNITS) else share.memory_percent
    if core == 0 and memory == 0:
        return DeviceShare(share.device_id)
    return DeviceShare(
        share.device_id, share.core_percent or SLICE_UNITS, share.memory_percent or SLICE_UNITS
    )


def container_response(spec: rpb.InjectionSpec) -> api_pb2.ContainerAllocateResponse:
    """The kubelet's ContainerAllocateResponse of a Runtime injection spec."""
    return api_pb2.ContainerAllocateResponse(
        envs=dict(spec.envs),
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in spec.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in spec.device_nodes
        ],
        annotations=dict(spec.annotations),
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in spec.cdi_devices],
    )


class Allocator:
    """Serves GetPreferredAllocation and Allocate for every resource of the plugin."""

    def __init__(
        self,
        rm: ResourceManager,
        runtime: RuntimeAccess,
        pods: NodePods,
        protocol: Protocol,
        *,
        recorder: PodRecorder | None = None,
        node_name: str = "",
        release_grace_s: float = 60.0,
    ) -> None:
        self._rm = rm
        self._runtime = runtime
        self._pods = pods
        self._protocol = protocol
        self._recorder = recorder
        self._node = node_name or "<this node>"
        self._release_grace_s = release_grace_s
        self._lock = asyncio.Lock()
        self.ledger: dict[str, Held] = {}
        self._background: set[asyncio.Task[None]] = set()

    # state

    def _implied(self, shares: Iterable[DeviceShare]) -> set[str]:
        """The resources a set of shares stands for."""
        res = self._protocol.resources
        kinds = {d.id: d.kind for d in self._rm.snapshot.devices}
        profiles = {m.id: m.profile for d in self._rm.snapshot.devices for m in d.mig_instances}
        out: set[str] = set()
        for share in shares:
            if not share.whole:
                out |= {res.core, res.memory}
            elif share.device_id in profiles:
                out.add(res.mig(profiles[share.device_id]))
            else:
                kind = kinds.get(share.device_id, rpb.DEVICE_KIND_GPU)
                out.add(
                    {rpb.DEVICE_KIND_PPU: res.ppu, rpb.DEVICE_KIND_AMD: res.amd}.get(kind, res.gpu)
                )
        return out

    async def rebuild(self) -> None:
        """Rebuild the ledger from the Runtime's allocations and the pods' records."""
        allocations = await self._runtime.client.list_allocations()
        async with self._lock:
            self.ledger.clear()
            for a in allocations:
                shares = tuple(
                    normalize(DeviceShare(d.device_id, d.core_percent, d.memory_percent))
                    for d in a.devices
                )
                self.ledger[a.container_key] = Held(
                    a.container_key,
                    a.pod_uid,
                    a.pod_namespace,
                    a.pod_name,
                    a.container_name,
                    shares,
                    self._implied(shares),
                )
            try:
                pods = await self._pods.list_pods()
            except PodLookupError as exc:
                log.warning("pod records not read at start reason=%r", str(exc))
                pods = []
            key = self._protocol.annotations.allocated_devices
            for pod in pods:
                text = pod.annotations.get(key)
                if text is None:
                    continue
                try:
                    record = decode_assignment(text)
                except AssignmentError as exc:
                    log.warning(
                        "pod record unreadable pod=%s annotation=%s reason=%r",
                        pod.ref,
                        key,
                        str(exc),
                    )
                    continue
                for container, shares in record.items():
                    ckey = f"{pod.uid}/{container}"
                    if ckey not in self.ledger:
                        log.warning(
                            "pod records an allocation the Runtime lacks pod=%s container=%s",
                            pod.ref,
                            container,
                        )
                        norm = tuple(normalize(s) for s in shares)
                        self.ledger[ckey] = Held(
                            ckey,
                            pod.uid,
                            pod.namespace,
                            pod.name,
                            container,
                            norm,
                            self._implied(norm),
                        )
            # A crash between the Runtime's Allocate and the record's write leaves a pod with
            # an allocation and no (or an older) record: write it now.
            holders = {h.pod_uid for h in self.ledger.values()}
            for pod in pods:
                if pod.uid in holders:
                    self._record(pod)
        log.info("allocations rebuilt containers=%d", len(self.ledger))

    def _done(self) -> set[DoneKey]:
        return {(h.pod_uid, h.container, r) for h in self.ledger.values() for r in h.called}

    def _busy(self) -> dict[str, list[str]]:
        """Device ID -> container keys holding any share of it."""
        busy: dict[str, list[str]] = {}
        for held in self.ledger.values():
            for share in held.shares:
                busy.setdefault(share.device_id, []).append(held.key)
        return busy

    # GetPreferredAllocation

    async def preferred(
        self, resource: str, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """Per container: the scheduler's assignment when it is available, else topology."""
        info = self._info(resource)
        try:
            pods: list[PodInfo] = await self._pods.list_pods()
        except PodLookupError as exc:
            log.warning("preferred allocation without pod list reason=%r", str(exc))
            pods = []
        out = api_pb2.PreferredAllocationResponse()
        async with self._lock:
            for creq in request.container_requests:
                ids = self._prefer(info, pods, creq)
                out.container_responses.append(
                    api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids)
                )
        return out

    def _prefer(
        self,
        info: ResourceInfo,
        pods: Sequence[PodInfo],
        creq: api_pb2.ContainerPreferredAllocationRequest,
    ) -> list[str]:
        size = creq.allocation_size
        available = list(creq.available_deviceIDs)
        must = list(creq.must_include_deviceIDs)
        ordered = candidates(
            pods,
            info.name,
            size,
            self._done(),
            {h.pod_uid for h in self.ledger.values()},
            self._protocol.annotations.assigned_devices,
            self._protocol.annotations.assume_time,
        )
        sliced = info.kind in (ResourceKind.CORE, ResourceKind.MEMORY)

        def pick(c: Candidate) -> list[str] | None:
            """The candidate's assignment as IDs the kubelet can give, or None."""
            ids = self._assigned_ids(c, info)
            if ids is None:
                return None
            if sliced:
                free = set(available)
                units = [*must, *(u for u in ids if u not in must and u in free)]
                return units[:size] if len(units) >= size else None
            fits = len(ids) == size and set(ids) <= set(available) and set(must) <= set(ids)
            return ids if fits else None

        cand, _ = choose(ordered, lambda c: pick(c) is not None)
        chosen = pick(cand) if cand is not None else None
        return chosen if chosen is not None else self._fallback(info, available, must, size)

    def _assigned_ids(self, cand: Candidate, info: ResourceInfo) -> list[str] | None:
        """The kubelet IDs of a candidate's assignment for `info` (all units of a slice)."""
        if cand.shares is None or cand.problem is not None:
            return None
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            sliced = [s.device_id for s in cand.shares if not s.whole]
            if len(sliced) != 1:
                return None
            return list(self._rm.snapshot.units(info.name, sliced[0]))
        return [s.device_id for s in cand.shares if s.whole]

    def _fallback(
        self, info: ResourceInfo, available: list[str], must: list[str], size: int
    ) -> list[str]:
        if info.kind == ResourceKind.WHOLE:
            devices = {d.id: d for d in self._rm.snapshot.devices}
            busy = self._busy()
            unsliced = [d for d in available if d not in busy]
            pool = unsliced if len(set(unsliced) | set(must)) >= size else available
            return best_set(pool, must, size, devices)
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            counts: dict[str | None, int] = {}
            for u in available:
                counts[slice_unit_device(u)] = counts.get(slice_unit_device(u), 0) + 1
            ranked = sorted(
                (u for u in available if u not in must),
                key=lambda u: (-counts[slice_unit_device(u)], u),
            )
            return [*must, *ranked][:size]
        return [*must, *(d for d in available if d not in must)][:size]

    # Allocate

    def _info(self, resource: str) -> ResourceInfo:
        info = resource_info(self._protocol, resource)
        if info is None:
            raise AllocationError(
                grpc.StatusCode.INTERNAL, f"resource {resource} is not served by this plugin"
            )
        return info

    def _validate(self, info: ResourceInfo, ids: Sequence[str]) -> None:
        name = info.name
        if not ids:
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT, f"Allocate for {name} names no device IDs"
            )
        if len(set(ids)) != len(ids):
            dup = sorted({d for d in ids if ids.count(d) > 1})
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Allocate for {name} names device IDs more than once: {', '.join(dup[:5])}",
            )
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY) and len(ids) > SLICE_UNITS:
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Allocate for {name} asks for {len(ids)} units; a container gets 1..100"
                " percent of one device",
            )
        known = self._rm.snapshot.ids(name)
        unknown = [d for d in ids if d not in known]
        if unknown:
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Allocate for {name} names unknown device IDs {', '.join(unknown[:5])}"
                f"{' ...' if len(unknown) > 5 else ''} (node {self._node} offers"
                f" {len(known)} devices of {name})",
            )

    async def allocate(
        self, resource: str, request: api_pb2.AllocateRequest
    ) -> api_pb2.AllocateResponse:
        """Answer each container request of a kubelet Allocate call."""
        info = self._info(resource)
        if not request.container_requests:
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT, f"Allocate for {resource} has no container"
            )
        for creq in request.container_requests:
            self._validate(info, list(creq.devices_ids))
        try:
            pods = await self._pods.list_pods()
        except PodLookupError as exc:
            raise AllocationError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        out = api_pb2.AllocateResponse()
        async with self._lock:
            self._note_gone(pods)
            for creq in request.container_requests:
                response = await self._allocate_one(info, list(creq.devices_ids), pods)
                out.container_responses.append(response)
        return out

    async def _allocate_one(
        self, info: ResourceInfo, ids: list[str], pods: Sequence[PodInfo]
    ) -> api_pb2.ContainerAllocateResponse:
        ann = self._protocol.annotations
        ordered = candidates(
            pods,
            info.name,
            len(ids),
            self._done(),
            {h.pod_uid for h in self.ledger.values()},
            ann.assigned_devices,
            ann.assume_time,
        )
        cand, by_devices = choose(ordered, lambda c: same_devices(c, info, ids))
        if cand is None:
            repeated = await self._repeated(info, ids, pods)
            if repeated is not None:
                return repeated
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no pending pod on node {self._node} asks for {len(ids)} of {info.name} without"
                f" having it already ({len(pods)} pods listed by the kubelet); was the pod"
                " deleted, or its resource limits changed?",
            )
        if cand.problem is not None:
            raise AllocationError(grpc.StatusCode.FAILED_PRECONDITION, cand.problem)
        if cand.shares is None:
            shares = self._unplaced(cand, info, ids)
        else:
            shares = tuple(normalize(s) for s in cand.shares)
            self._check_assignment(cand, info, ids, shares)
            if not by_devices:
                log.info(
                    "kubelet chose other devices than the scheduler, allocating the"
                    " scheduler's pod=%s container=%s resource=%s",
                    cand.pod.ref,
                    cand.container.name,
                    info.name,
                )
        held = self.ledger.get(cand.key)
        if held is not None and held.shares != shares:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{cand.ref} already holds {_describe(held.shares)} and now needs"
                f" {_describe(shares)} for {info.name}; a container without a scheduler"
                " assignment can take one device resource only",
            )
        response = await self._runtime_allocate(cand, shares)
        if held is None:
            held = Held(
                cand.key,
                cand.pod.uid,
                cand.pod.namespace,
                cand.pod.name,
                cand.container.name,
                shares,
            )
            self.ledger[cand.key] = held
        held.called.add(info.name)
        log.info(
            "allocated pod=%s container=%s resource=%s devices=%s by=%s",
            cand.pod.ref,
            cand.container.name,
            info.name,
            _describe(shares),
            "devices" if by_devices else "order",
        )
        self._record(cand.pod)
        return container_response(response.spec)

    async def _repeated(
        self, info: ResourceInfo, ids: Sequence[str], pods: Sequence[PodInfo]
    ) -> api_pb2.ContainerAllocateResponse | None:
        """A kubelet that lost its checkpoint asks again for a running container's devices.

        When exactly one allocated container of an active pod holds exactly these
        devices (or the slice on the device of these units), answer its spec again
        (the Runtime's Allocate is idempotent per container key) instead of failing
        a running pod. Nothing new is handed out.
        """
        sliced = info.kind in (ResourceKind.CORE, ResourceKind.MEMORY)
        parents = {slice_unit_device(u) for u in ids} if sliced else set()
        active = {p.uid: p for p in pods if p.active}
        matches = []
        for held in self.ledger.values():
            if info.name not in held.called or held.pod_uid not in active:
                continue
            mine = {s.device_id for s in held.shares if s.whole != sliced}
            if (parents if sliced else set(ids)) == mine:
                matches.append(held)
        if len(matches) != 1:
            return None
        held = matches[0]
        pod = active[held.pod_uid]
        container = next((c for c in pod.containers if c.name == held.container), None)
        if container is None or container.limits.get(info.name) != len(ids):
            return None
        cand = Candidate(pod, container, held.shares, None, ())
        log.warning(
            "repeated Allocate answered again pod=%s container=%s resource=%s",
            pod.ref,
            held.container,
            info.name,
        )
        response = await self._runtime_allocate(cand, held.shares)
        return container_response(response.spec)

    def _check_assignment(
        self,
        cand: Candidate,
        info: ResourceInfo,
        ids: Sequence[str],
        shares: tuple[DeviceShare, ...],
    ) -> None:
        key = self._protocol.annotations.assigned_devices
        n = len(ids)
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            sliced = [s for s in shares if not s.whole]
            if len(sliced) != 1 or len(shares) != 1:
                raise AllocationError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{cand.ref} asks for {n} of {info.name} but annotation {key} gives it"
                    f" {_describe(shares)}; a slice container gets one slice of one device",
                )
            share = sliced[0]
            got = share.core_percent if info.kind == ResourceKind.CORE else share.memory_percent
            if got != n:
                raise AllocationError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{cand.ref} asks for {n} of {info.name} but annotation {key} gives it"
                    f" {got}% {info.kind.value} of device {share.device_id}",
                )
            if self._rm.device(share.device_id) is None:
                raise AllocationError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"annotation {key} of pod {cand.pod.ref} names device {share.device_id},"
                    f" which node {self._node} does not have",
                )
            return
        offered = {d.id for d in self._rm.resources().get(info.name, ())}
        mine = [s for s in shares if s.whole and s.device_id in offered]
        if len(mine) != n:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{cand.ref} asks for {n} of {info.name} but annotation {key} gives it"
                f" {_describe(shares)} ({len(mine)} of them are {info.name} devices of"
                f" node {self._node})",
            )

    def _unplaced(
        self, cand: Candidate, info: ResourceInfo, ids: list[str]
    ) -> tuple[DeviceShare, ...]:
        key = self._protocol.annotations.assigned_devices
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{cand.ref} asks for {len(ids)} of {info.name} but carries no {key}"
                " annotation: TDM slices are placed by the Runtime Kit scheduler; schedule the"
                " pod with it (spec.schedulerName) or ask for whole devices",
            )
        busy = self._busy()
        if info.kind == ResourceKind.MIG:
            taken = [d for d in ids if d in busy]
            if taken:
                raise AllocationError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{cand.ref}: MIG instance {taken[0]} is held by {busy[taken[0]][0]}",
                )
            return tuple(DeviceShare(d) for d in ids)
        healthy = [
            d.id for d in self._rm.resources().get(info.name, ()) if d.healthy and d.id not in busy
        ]
        chosen = [d for d in ids if d not in busy]
        if len(chosen) < len(ids):
            devices = {d.id: d for d in self._rm.snapshot.devices}
            pool = [d for d in healthy if d not in chosen]
            if len(pool) + len(chosen) < len(ids):
                sliced = sorted(d for d in ids if d in busy)
                raise AllocationError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{cand.ref} was not placed by the Runtime Kit scheduler (no {key}"
                    f" annotation) and asks for {len(ids)} whole {info.name}, but only"
                    f" {len(healthy)} device(s) of node {self._node} carry no slice or other"
                    f" container (busy: {', '.join(sliced[:4])}); schedule the pod with the"
                    " Runtime Kit scheduler or free a device",
                )
            chosen = best_set(pool, chosen, len(ids), devices)
            log.info(
                "unplaced pod served from free devices pod=%s container=%s devices=%s",
                cand.pod.ref,
                cand.container.name,
                ",".join(chosen),
            )
        return tuple(DeviceShare(d) for d in chosen)

    async def _runtime_allocate(
        self, cand: Candidate, shares: tuple[DeviceShare, ...]
    ) -> rpb.AllocateResponse:
        request = rpb.AllocateRequest(
            container_key=cand.key,
            pod_namespace=cand.pod.namespace,
            pod_name=cand.pod.name,
            container_name=cand.container.name,
            pod_uid=cand.pod.uid,
            devices=[
                rpb.DeviceRequest(
                    device_id=s.device_id,
                    core_percent=s.core_percent,
                    memory_percent=s.memory_percent,
                )
                for s in shares
            ],
        )
        try:
            return await self._runtime.client.allocate(request)
        except RuntimeCallError as exc:
            code = exc.code if exc.code in _PASSED_THROUGH else grpc.StatusCode.UNAVAILABLE
            raise AllocationError(
                code, f"Runtime refused {_describe(shares)} for {cand.ref}: {exc.details}"
            ) from exc
        except RuntimeUnavailableError as exc:
            raise AllocationError(
                grpc.StatusCode.UNAVAILABLE, f"allocating for {cand.ref}: {exc}"
            ) from exc

    # records and clean-up

    def _record(self, pod: PodInfo) -> None:
        if self._recorder is None:
            return
        ann = self._protocol.annotations
        held = {h.container: h for h in self.ledger.values() if h.pod_uid == pod.uid}
        value = encode_assignment({c: h.shares for c, h in held.items()})
        served = self._rm.resources()
        complete = all(
            resource in held[c.name].called if c.name in held else False
            for c in pod.containers
            for resource in c.limits
            if resource in served
        )
        annotations = {ann.allocated_devices: value}
        if complete:
            annotations[ann.bind_phase] = BIND_PHASE_ALLOCATED
        if all(pod.annotations.get(k) == v for k, v in annotations.items()):
            return
        self._recorder.submit(pod.namespace, pod.name, annotations)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _note_gone(self, pods: Sequence[PodInfo]) -> None:
        """Release the Runtime allocations of pods that finished or left the node."""
        by_uid: Mapping[str, PodInfo] = {p.uid: p for p in pods}
        now = time.monotonic()
        for held in list(self.ledger.values()):
            pod = by_uid.get(held.pod_uid)
            if pod is not None and pod.active:
                held.missing_since = None
                continue
            if pod is None:
                if held.missing_since is None:
                    held.missing_since = now
                if now - held.missing_since < self._release_grace_s:
                    continue
            del self.ledger[held.key]
            self._spawn(self._release(held))

    async def _release(self, held: Held) -> None:
        try:
            released = await self._runtime.client.release(held.key)
        except (RuntimeCallError, RuntimeUnavailableError) as exc:
            log.warning("release failed container=%s reason=%r", held.key, str(exc))
            return
        log.info(
            "released pod=%s/%s container=%s released=%s",
            held.namespace,
            held.name,
            held.container,
            released,
        )

    async def collect(self) -> None:
        """One clean-up round outside Allocate (the periodic loop calls it)."""
        try:
            pods = await self._pods.list_pods()
        except PodLookupError as exc:
            log.warning("clean-up skipped reason=%r", str(exc))
            return
        async with self._lock:
            self._note_gone(pods)

    async def run_collector(self, stop: asyncio.Event, interval_s: float) -> None:
        """Call `collect` every `interval_s` until `stop`."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                await self.collect()

    async def close(self) -> None:
        """Wait for pending records and releases."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=5)
        if self._recorder is not None:
            await self._recorder.drain()


def _describe(shares: Iterable[DeviceShare]) -> str:
    parts = [
        s.device_id
        if s.whole
        else f"{s.device_id}({s.core_percent}% core, {s.memory_percent}% memory)"
        for s in shares
    ]
    return ", ".join(parts) or "no device"
