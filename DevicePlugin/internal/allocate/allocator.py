"""Allocate and GetPreferredAllocation: the pod in admission, exactly the kubelet's devices.

The pod comes from the admission protocol (`resolve`); the devices a container
gets are exactly the IDs the kubelet passed, checked against the scheduler's
assignment of the pod, or the call is refused: the kubelet's record, the
container's devices and the Runtime's allocation never differ.

State (the ledger: container key -> what it holds and which resources the
kubelet already asked for) is rebuilt at start from the Runtime's
ListAllocations and the pods' `annotations.allocated_devices`, so a restart
of the plugin never hands out an assignment twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol as TypingProtocol

import grpc

from lj_runtimekit.deviceplugin.internal.allocate.resolve import (
    DoneKey,
    Waiting,
    device_containers,
    next_container,
    waiting_pods,
)
from lj_runtimekit.deviceplugin.internal.allocate.topology import best_set
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import (
    TERMINAL_PHASES,
    ContainerInfo,
    NodePods,
    PodInfo,
    PodLookupError,
)
from lj_runtimekit.deviceplugin.internal.podresources.check import (
    Difference,
    PodResourcesClient,
    compare,
)
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager, RuntimeAccess
from lj_runtimekit.deviceplugin.internal.rm.resources import (
    SLICE_UNITS,
    ResourceInfo,
    ResourceKind,
    resource_info,
    slice_unit_device,
)
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import (
    BIND_PHASE_ALLOCATED,
    AssignmentError,
    DeviceShare,
    Protocol,
    decode_assignment,
    encode_assignment,
)
from lj_runtimekit.proto.pkg.runtimeclient import (
    RuntimeCallError,
    RuntimeUnavailableError,
    from_request,
    normalize,
    to_request,
)

log = logging.getLogger(__name__)

_PASSED_THROUGH = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
}


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
    init: bool = False
    """A run-to-completion init container (its devices go to the app containers again)."""
    sidecar: bool = False
    missing_since: float | None = None
    units: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The slice unit IDs the kubelet passed to Allocate, per resource (none after a
    rebuild)."""


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
        pod_resources: PodResourcesClient | None = None,
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
        self._refused: dict[str, None] = {}
        """Pods a call was refused for: the kubelet rejects such a pod at once, though its
        pod list still shows it Pending for a moment (oldest first, bounded)."""
        self._pod_resources = pod_resources
        self.differences: list[Difference] = []
        """The last cross-check's differences between the kubelet's record and the ledger."""
        self._reported: set[tuple[str, str, str]] = set()
        self._seen_last: set[tuple[str, str, str]] = set()
        """The differences of the cross-check before the last (see `cross_check`)."""
        self._whole_of: tuple[object, dict[str, str]] = (None, {})
        """(snapshot, device or MIG instance ID -> resource) of the last snapshot."""

    # state

    def _resource_of(self, share: DeviceShare) -> set[str]:
        """The resources a share stands for (a slice: core and memory)."""
        res = self._protocol.resources
        if not share.whole:
            return {res.core, res.memory}
        snapshot = self._rm.snapshot
        if self._whole_of[0] is not snapshot:
            table = {
                d.id: kind.resource(res)
                for d in snapshot.devices
                if (kind := devicekind.by_value(d.kind)) is not None
            }
            for d in snapshot.devices:
                table.update({m.id: res.mig(m.profile) for m in d.mig_instances})
            self._whole_of = (snapshot, table)
        return {self._whole_of[1].get(share.device_id, res.gpu)}

    def _implied(self, shares: Iterable[DeviceShare]) -> set[str]:
        """The resources a set of shares stands for."""
        out: set[str] = set()
        for share in shares:
            out |= self._resource_of(share)
        return out

    async def rebuild(self) -> None:
        """Rebuild the ledger from the Runtime's allocations and the pods' records."""
        allocations = await self._runtime.client.list_allocations()
        async with self._lock:
            self.ledger.clear()
            for a in allocations:
                shares = tuple(from_request(d) for d in a.devices)
                self.ledger[a.container_key] = Held(
                    a.container_key,
                    a.pod_uid,
                    a.pod_namespace,
                    a.pod_name,
                    a.container_name,
                    shares,
                    self._implied(shares),
                    init=a.init_container,
                )
            try:
                pods = await self._pods.list_pods()
            except PodLookupError as exc:
                log.warning("pod records not read at start", extra={"reason": str(exc)})
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
                        "pod record unreadable",
                        extra={"pod": pod.ref, "annotation": key, "reason": str(exc)},
                    )
                    continue
                for container, shares in record.items():
                    ckey = f"{pod.uid}/{container}"
                    if ckey not in self.ledger:
                        log.warning(
                            "pod records an allocation the Runtime lacks",
                            extra={"pod": pod.ref, "container": container},
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
        log.info("allocations rebuilt", extra={"containers": len(self.ledger)})

    def _done(self) -> set[DoneKey]:
        return {(h.pod_uid, h.container, r) for h in self.ledger.values() for r in h.called}

    def _busy(self) -> dict[str, list[str]]:
        """Device ID -> container keys holding any share of it."""
        busy: dict[str, list[str]] = {}
        for held in self.ledger.values():
            for share in held.shares:
                busy.setdefault(share.device_id, []).append(held.key)
        return busy

    # the pod in admission

    def _waiting(self, pods: Sequence[PodInfo], done: set[DoneKey]) -> list[Waiting]:
        served = self._rm.resources()
        ann = self._protocol.annotations
        listed = [p for p in pods if p.uid not in self._refused]
        return waiting_pods(listed, served.__contains__, done, ann.assigned_devices, ann.bind_phase)

    def _refuse(self, pod: PodInfo) -> None:
        """Remember that a call for `pod` failed: the kubelet has rejected it."""
        self._refused[pod.uid] = None
        while len(self._refused) > 10000:
            self._refused.pop(next(iter(self._refused)))

    async def _list(self) -> list[PodInfo]:
        try:
            return await self._pods.list_pods()
        except PodLookupError as exc:
            raise AllocationError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc

    async def _fresh(self) -> list[PodInfo] | None:
        try:
            return await self._pods.fresh()
        except PodLookupError as exc:
            log.warning("API server pod list failed", extra={"reason": str(exc)})
            return None

    async def _admitting(self) -> tuple[list[Waiting], list[PodInfo]]:
        """The pods waiting for devices (one when the protocol holds), and the pod list.

        The pod list is the kubelet's when it answers; where it shows no or several
        waiting pods, or a pod holding devices has left it, the API server's list
        (read now) decides: a pod the kubelet rejected is Failed there before the
        scheduler binds the node's next device pod.
        """
        pods = await self._list()
        await self._release_finished(pods, fresh=False)
        done = self._done()
        waiting = self._waiting(pods, done)
        missing = any(h.missing_since is not None for h in self.ledger.values())
        if len(waiting) != 1 or missing:
            fresh = await self._fresh()
            if fresh is not None:
                await self._release_finished(fresh, fresh=True)
                done = self._done()
                fresh_waiting = self._waiting(fresh, done)
                listed = {p.uid for p in pods}
                # The API server may already hold a pod the kubelet has not reached: only
                # pods the kubelet lists can be the one it is admitting.
                waiting = [w for w in fresh_waiting if w.pod.uid in listed] or fresh_waiting
                pods = fresh
        if not self._pods.from_kubelet:
            # The API server lists every pod bound to the node at once, and forgets a pod
            # deleted while the kubelet may still be admitting it; the kubelet's active pods
            # (PodResources) hold the pod it admits and none it has yet to reach.
            active = await self._kubelet_active()
            if active is not None:
                waiting = [w for w in waiting if (w.pod.namespace, w.pod.name) in active]
        return waiting, pods

    async def _kubelet_active(self) -> set[tuple[str, str]] | None:
        """(namespace, name) of the pods the kubelet holds active, the one it is admitting
        included (PodResources `List`); None without the socket or when it fails."""
        listed = await self._read_pod_resources()
        if listed is None:
            return None
        return {(p.namespace, p.name) for p in listed.pod_resources}

    async def _read_pod_resources(self) -> prpb.ListPodResourcesResponse | None:
        """The kubelet's PodResources `List`; None without the socket or when it fails."""
        client = self._pod_resources
        if client is None or not client.available:
            return None
        try:
            return await client.list()
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "pod resources not read",
                extra={"socket": client.socket_path, "reason": exc.details()},
            )
            return None

    def _one(self, waiting: Sequence[Waiting], resource: str, count: int) -> Waiting:
        if len(waiting) > 1:
            refs = sorted(w.pod.ref for w in waiting)
            names = ", ".join(refs[:5]) + (f" and {len(refs) - 5} more" if len(refs) > 5 else "")
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"cannot tell which pod the kubelet is admitting on node {self._node}:"
                f" {len(refs)} pods wait for devices ({names}); with the Runtime Kit scheduler"
                " only one can (docs/protocol.md), so one of them was bound around it"
                " (spec.nodeName set at creation, or another scheduler); refusing rather than"
                " guessing",
            )
        if not waiting:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no pod on node {self._node} waits for devices, yet the kubelet asks for"
                f" {count} of {resource}; was the pod deleted, or its resource limits changed?",
            )
        return waiting[0]

    # GetPreferredAllocation

    async def preferred(
        self, resource: str, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """Per container: the assigned devices of the pod in admission, else topology."""
        info = self._info(resource)
        out = api_pb2.PreferredAllocationResponse()
        async with self._lock:
            try:
                waiting, _ = await self._admitting()
            except AllocationError as exc:
                log.warning("preferred allocation without pod list", extra={"reason": str(exc)})
                waiting = []
            done = self._done()
            for creq in request.container_requests:
                ids = None
                if len(waiting) == 1 and waiting[0].assignment is not None:
                    ids = self._prefer(info, waiting[0], done, creq)
                if ids is None:
                    ids = self._fallback(
                        info,
                        list(creq.available_deviceIDs),
                        list(creq.must_include_deviceIDs),
                        creq.allocation_size,
                    )
                out.container_responses.append(
                    api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids)
                )
        return out

    def _prefer(
        self,
        info: ResourceInfo,
        waiting: Waiting,
        done: set[DoneKey],
        creq: api_pb2.ContainerPreferredAllocationRequest,
    ) -> list[str] | None:
        """The next container's assigned IDs the kubelet can give, or None."""
        pod, assignment = waiting.pod, waiting.assignment
        container = next_container(pod, info.name, done)
        if container is None or assignment is None:
            return None
        size = creq.allocation_size
        available = set(creq.available_deviceIDs)
        must = list(creq.must_include_deviceIDs)
        own = assignment.get(container.name, ())
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            sliced = [s.device_id for s in own if not s.whole]
            if len(sliced) != 1:
                return None
            units = self._rm.snapshot.units(info.name, sliced[0])
            held = self._held_units(info.name)
            free = [u for u in units if u not in must and u in available]
            chosen = [*must, *sorted(free, key=lambda u: u in held)]
        else:
            pool = self._pool(assignment, info)
            clash = self._clash_set(pod, container)
            ranked = [s.device_id for s in own if s.device_id in pool] + sorted(pool)
            chosen = [*must, *(d for d in dict.fromkeys(ranked) if d not in must)]
            chosen = [d for d in chosen if d in must or (d in available and d not in clash)]
        return chosen[:size] if len(chosen) >= size else None

    def _held_units(self, resource: str) -> set[str]:
        """Slice units of `resource` the kubelet passed for containers the plugin holds.

        The kubelet may offer them again: its device manager rebuilds its set of allocated
        IDs from its per-pod record whenever a PodResources `List` finds a pod to forget,
        and a container whose Allocate call is under way at that moment is not in that
        record yet, so its IDs read as free until the next rebuild. Preferring other units
        keeps two containers from recording the same unit (the Runtime's percentages are
        right either way; the kubelet's record and what reads it would not be)."""
        return {u for held in self.ledger.values() for u in held.units.get(resource, ())}

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
            held = self._held_units(info.name)
            ranked = sorted(
                (u for u in available if u not in must),
                key=lambda u: (-counts[slice_unit_device(u)], u in held, u),
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
        out = api_pb2.AllocateResponse()
        async with self._lock:
            for creq in request.container_requests:
                response = await self._allocate_one(info, list(creq.devices_ids))
                out.container_responses.append(response)
        return out

    async def _allocate_one(
        self, info: ResourceInfo, ids: list[str]
    ) -> api_pb2.ContainerAllocateResponse:
        waiting, pods = await self._admitting()
        try:
            w, container, part = self._resolve(waiting, info, ids)
        except AllocationError:
            # A kubelet that lost its checkpoint asks again for a running container's devices.
            repeated = await self._repeated(info, ids, pods, {x.pod.uid for x in waiting})
            if repeated is not None:
                return repeated
            if len(waiting) == 1:
                self._refuse(waiting[0].pod)
            raise
        pod = w.pod
        held = self.ledger.get(f"{pod.uid}/{container.name}")
        if held is not None:
            mine = tuple(s for s in held.shares if info.name in self._resource_of(s))
            if mine and set(mine) != set(part):
                self._refuse(pod)
                raise AllocationError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"pod {pod.ref} container {container.name} holds {_describe(mine)} for"
                    f" {info.name} from an earlier call, but the kubelet now passes"
                    f" {_describe(part)}",
                )
            shares = held.shares if mine else (*held.shares, *part)
        else:
            assignment = w.assignment or {}
            others = tuple(
                s
                for s in assignment.get(container.name, ())
                if info.name not in self._resource_of(s)
            )
            shares = (*part, *others)
        try:
            response = await self._runtime_allocate(pod, container, shares)
        except AllocationError:
            self._refuse(pod)
            raise
        if held is None or held.shares != shares:
            called = held.called if held is not None else set()
            held = Held(
                f"{pod.uid}/{container.name}",
                pod.uid,
                pod.namespace,
                pod.name,
                container.name,
                shares,
                called,
                init=container.run_to_completion,
                sidecar=container.sidecar,
                units=held.units if held is not None else {},
            )
            self.ledger[held.key] = held
        held.called.add(info.name)
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            held.units[info.name] = tuple(ids)
        log.info(
            "allocated",
            extra={
                "pod": pod.ref,
                "container": container.name,
                "resource": info.name,
                "devices": _describe(part),
            },
        )
        self._record(pod)
        return container_response(response.spec)

    def _resolve(
        self, waiting: Sequence[Waiting], info: ResourceInfo, ids: Sequence[str]
    ) -> tuple[Waiting, ContainerInfo, tuple[DeviceShare, ...]]:
        """The pod in admission, its container this call is for, and what it gets; or
        AllocationError saying why the call cannot be served exactly."""
        w = self._one(waiting, info.name, len(ids))
        pod = w.pod
        container = next_container(pod, info.name, self._done())
        if container is None:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod.ref} is admitted on node {self._node} but none of its containers"
                f" still waits for {info.name} (the kubelet asks for {len(ids)})",
            )
        ref = f"pod {pod.ref} container {container.name}"
        asked = container.limits[info.name]
        if asked != len(ids):
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the kubelet asks for {len(ids)} of {info.name}, but the next container of the"
                f" pod in admission ({ref}) asks for {asked}",
            )
        if w.problem is not None:
            raise AllocationError(grpc.StatusCode.FAILED_PRECONDITION, w.problem)
        if w.assignment is None:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{ref} asks for {len(ids)} of {info.name} but carries no"
                f" {self._protocol.annotations.assigned_devices} annotation: it was not placed"
                " by the Runtime Kit scheduler (spec.nodeName set at creation, or another"
                " scheduler); device pods must be scheduled by it so that no device is given"
                " to two pods",
            )
        if container.name not in w.assignment:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"annotation {self._protocol.annotations.assigned_devices} of pod {pod.ref} has"
                f" no entry for container {container.name}, which asks for {asked} of"
                f" {info.name}",
            )
        part = self._part(w.assignment, container, info, ids, ref)
        clash = sorted(self._clash_set(pod, container) & {s.device_id for s in part})
        if clash:
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the kubelet passes {', '.join(clash)} for {ref}, which another container of"
                " the pod that runs beside it already holds",
            )
        return w, container, part

    def _pool(
        self, assignment: Mapping[str, tuple[DeviceShare, ...]], info: ResourceInfo
    ) -> set[str]:
        """Every whole device (or MIG instance) of `info` assigned to any container of the pod."""
        return {
            s.device_id
            for shares in assignment.values()
            for s in shares
            if s.whole and info.name in self._resource_of(s)
        }

    def _clash_set(self, pod: PodInfo, container: ContainerInfo) -> set[str]:
        """Devices of the pod the container must not get: those of containers that run beside
        it (app containers and sidecars for an app container or sidecar; sidecars for an init
        container). The kubelet hands init containers' devices to the app containers again."""
        out: set[str] = set()
        for held in self.ledger.values():
            if held.pod_uid != pod.uid or held.container == container.name:
                continue
            if held.sidecar or (not container.run_to_completion and not held.init):
                out |= {s.device_id for s in held.shares if s.whole}
        return out

    def _part(
        self,
        assignment: Mapping[str, tuple[DeviceShare, ...]],
        container: ContainerInfo,
        info: ResourceInfo,
        ids: Sequence[str],
        ref: str,
    ) -> tuple[DeviceShare, ...]:
        """What the container gets for this call: exactly the kubelet's IDs, when they agree
        with the scheduler's assignment of the pod; AllocationError otherwise."""
        key = self._protocol.annotations.assigned_devices
        refuse = grpc.StatusCode.FAILED_PRECONDITION
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            own = assignment.get(container.name, ())
            sliced = [s for s in own if not s.whole]
            if len(sliced) != 1 or len(own) != 1:
                raise AllocationError(
                    refuse,
                    f"{ref} asks for {len(ids)} of {info.name} but annotation {key} gives it"
                    f" {_describe(own)}; a slice container gets one slice of one device",
                )
            share = sliced[0]
            got = share.core_percent if info.kind == ResourceKind.CORE else share.memory_percent
            if got != len(ids):
                raise AllocationError(
                    refuse,
                    f"{ref} asks for {len(ids)} of {info.name} but annotation {key} gives it"
                    f" {got}% {info.kind.value} of device {share.device_id}",
                )
            parents = sorted({slice_unit_device(u) or u for u in ids})
            if parents != [share.device_id]:
                raise AllocationError(
                    refuse,
                    f"the kubelet passes {info.name} units of {', '.join(parents)} for {ref},"
                    f" but the scheduler assigned it a slice of {share.device_id}: the kubelet's"
                    " record and the container's devices would differ",
                )
            return (normalize(share),)
        pool = self._pool(assignment, info)
        outside = sorted(d for d in ids if d not in pool)
        if outside:
            raise AllocationError(
                refuse,
                f"the kubelet passes {info.name} {', '.join(outside[:4])} for {ref}, which the"
                f" scheduler did not assign to the pod (its {info.name}:"
                f" {', '.join(sorted(pool)) or 'none'}): the kubelet's record and the"
                " container's devices would differ",
            )
        return tuple(DeviceShare(d) for d in ids)

    async def _repeated(
        self,
        info: ResourceInfo,
        ids: Sequence[str],
        pods: Sequence[PodInfo],
        waiting: Collection[str],
    ) -> api_pb2.ContainerAllocateResponse | None:
        """A kubelet that lost its checkpoint asks again for a running container's devices.

        When exactly one allocated container of an active pod holds exactly these
        devices (or the slice on the device of these units), answer its spec again
        (the Runtime's Allocate is idempotent per container key) instead of failing
        a running pod. Nothing new is handed out.
        """
        sliced = info.kind in (ResourceKind.CORE, ResourceKind.MEMORY)
        parents = {slice_unit_device(u) for u in ids} if sliced else set()
        active = {p.uid: p for p in pods if p.active and p.uid not in waiting}
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
        log.warning(
            "repeated Allocate answered again",
            extra={"pod": pod.ref, "container": held.container, "resource": info.name},
        )
        response = await self._runtime_allocate(pod, container, held.shares)
        return container_response(response.spec)

    async def _runtime_allocate(
        self, pod: PodInfo, container: ContainerInfo, shares: tuple[DeviceShare, ...]
    ) -> rpb.AllocateResponse:
        ref = f"pod {pod.ref} container {container.name}"
        request = rpb.AllocateRequest(
            container_key=f"{pod.uid}/{container.name}",
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            container_name=container.name,
            pod_uid=pod.uid,
            devices=[to_request(s) for s in shares],
            init_container=container.run_to_completion,
        )
        try:
            return await self._runtime.client.allocate(request)
        except RuntimeCallError as exc:
            code = exc.code if exc.code in _PASSED_THROUGH else grpc.StatusCode.UNAVAILABLE
            raise AllocationError(
                code, f"Runtime refused {_describe(shares)} for {ref}: {exc.details}"
            ) from exc
        except RuntimeUnavailableError as exc:
            raise AllocationError(
                grpc.StatusCode.UNAVAILABLE, f"allocating for {ref}: {exc}"
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
            c in held and r in held[c].called
            for c, r in device_containers(pod, served.__contains__)
        )
        annotations = {ann.allocated_devices: value}
        if complete:
            annotations[ann.bind_phase] = BIND_PHASE_ALLOCATED
        if all(pod.annotations.get(k) == v for k, v in annotations.items()):
            return
        self._recorder.submit(pod.namespace, pod.name, annotations)

    async def _release_finished(self, pods: Sequence[PodInfo], *, fresh: bool) -> None:
        """Release the Runtime allocations of pods whose containers are gone: the pod finished
        (Succeeded/Failed), or it left the pod list (at once when `fresh`, the API server's
        list; after the release grace in the kubelet's, which is empty for a moment when the
        kubelet restarts). A pod being deleted keeps its devices until then: its containers
        still run their grace period."""
        by_uid: Mapping[str, PodInfo] = {p.uid: p for p in pods}
        now = time.monotonic()
        for held in list(self.ledger.values()):
            pod = by_uid.get(held.pod_uid)
            if pod is not None and pod.phase not in TERMINAL_PHASES:
                held.missing_since = None
                continue
            if pod is None and not fresh:
                if held.missing_since is None:
                    held.missing_since = now
                if now - held.missing_since < self._release_grace_s:
                    continue
            await self._release(held)

    async def _release(self, held: Held) -> None:
        try:
            released = await self._runtime.client.release(held.key)
        except (RuntimeCallError, RuntimeUnavailableError) as exc:
            log.warning("release failed", extra={"container": held.key, "reason": str(exc)})
            return
        self.ledger.pop(held.key, None)
        log.info(
            "released",
            extra={
                "pod": f"{held.namespace}/{held.name}",
                "container": held.container,
                "released": released,
            },
        )

    async def collect(self) -> None:
        """One clean-up round outside Allocate (the periodic loop calls it)."""
        try:
            pods = await self._pods.list_pods()
        except PodLookupError as exc:
            log.warning("clean-up skipped", extra={"reason": str(exc)})
            return
        async with self._lock:
            await self._release_finished(pods, fresh=False)
            if any(h.missing_since is not None for h in self.ledger.values()):
                fresh = await self._fresh()
                if fresh is not None:
                    await self._release_finished(fresh, fresh=True)
            await self.cross_check(pods)

    async def cross_check(self, pods: Sequence[PodInfo]) -> list[Difference]:
        """Compare the kubelet's PodResources record with the ledger; log each difference
        once when two rounds in a row show it (a difference means a device may be held by
        two pods; one round alone can fall between the kubelet's Allocate calls for one
        container's core and memory resources, which it records one by one)."""
        listed = await self._read_pod_resources()
        if listed is None:
            return []
        res = self._protocol.resources
        served = {(h.pod_uid, h.container): h.shares for h in self.ledger.values()}
        self.differences = compare(
            listed, pods, served, self._rm.resources(), self._resource_of, res.core, res.memory
        )
        keys = set()
        for diff in self.differences:
            key = (diff.pod, diff.container, diff.resource)
            keys.add(key)
            if key in self._seen_last and key not in self._reported:
                log.warning(
                    "kubelet record differs from the allocation", extra={"difference": diff}
                )
                self._reported.add(key)
        self._reported &= keys
        self._seen_last = keys
        return self.differences

    async def run_collector(self, stop: asyncio.Event, interval_s: float) -> None:
        """Call `collect` every `interval_s` until `stop`."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                await self.collect()

    async def close(self) -> None:
        """Wait for pending records."""
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
