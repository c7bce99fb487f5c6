"""Allocate and GetPreferredAllocation: the pod in admission, exactly the kubelet's devices.

The pod comes from the admission protocol (`admission`, `resolve`); the devices a
container gets are exactly the IDs the kubelet passed, checked against the
scheduler's assignment of the pod (`exact`), or the call is refused: the
kubelet's record, the container's devices and the Runtime's allocation never
differ. The state is the `ledger`; `collect` releases what finished pods hold,
`records` writes what was served on the pod, `crosscheck` compares the kubelet's
PodResources record with the ledger.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from lj_runtimekit.deviceplugin.internal.allocate import preferred as prefer
from lj_runtimekit.deviceplugin.internal.allocate.admission import Admission
from lj_runtimekit.deviceplugin.internal.allocate.collect import Collector
from lj_runtimekit.deviceplugin.internal.allocate.crosscheck import CrossCheck
from lj_runtimekit.deviceplugin.internal.allocate.exact import resolve_call
from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held, Ledger, describe
from lj_runtimekit.deviceplugin.internal.allocate.records import PodRecorder, record
from lj_runtimekit.deviceplugin.internal.allocate.refusals import RefusedPods, one_pod
from lj_runtimekit.deviceplugin.internal.allocate.resolve import Waiting, next_container
from lj_runtimekit.deviceplugin.internal.allocate.runtime import (
    container_response,
    runtime_allocate,
)
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import NodePods, PodInfo, PodLookupError
from lj_runtimekit.deviceplugin.internal.podresources.check import (
    Difference,
    PodResourcesClient,
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
from lj_runtimekit.proto.pkg.protocol import Protocol

log = logging.getLogger(__name__)


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
        require_assignment_uid: bool = False,
    ) -> None:
        self._rm = rm
        self._runtime = runtime
        self._pods = pods
        self._protocol = protocol
        self._recorder = recorder
        self._node = node_name or "<this node>"
        self._lock = asyncio.Lock()
        self.ledger = Ledger(rm, protocol)
        self._refused = RefusedPods()
        self._collector = Collector(self.ledger, runtime, release_grace_s)
        self._crosscheck = CrossCheck(pod_resources, self.ledger, rm, protocol)
        self._admission = Admission(
            pods,
            rm,
            protocol,
            self.ledger,
            self._refused,
            self._collector,
            self._crosscheck,
            require_uid=require_assignment_uid,
        )

    @property
    def differences(self) -> list[Difference]:
        """The last cross-check's differences between the kubelet's record and the ledger."""
        return self._crosscheck.differences

    async def rebuild(self) -> None:
        """Rebuild the ledger from the Runtime's allocations and the pods' records."""
        allocations = await self._runtime.client.list_allocations()
        async with self._lock:
            try:
                pods = await self._pods.list_pods()
            except PodLookupError as exc:
                log.warning("pod records not read at start", extra={"reason": str(exc)})
                pods = []
            self.ledger.rebuild(allocations, pods)
            # A crash between the Runtime's Allocate and the record's write leaves a pod with
            # an allocation and no (or an older) record: write it now.
            for pod in self.ledger.holders(pods):
                self._record(pod)
        log.info("allocations rebuilt", extra={"containers": len(self.ledger.entries)})

    # GetPreferredAllocation

    async def preferred(
        self, resource: str, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """Per container: the assigned devices of the pod in admission, else topology."""
        info = self._info(resource)
        out = api_pb2.PreferredAllocationResponse()
        async with self._lock:
            try:
                waiting = (await self._admission.admitting()).waiting
            except AllocationError as exc:
                log.warning("preferred allocation without pod list", extra={"reason": str(exc)})
                waiting = []
            done = self.ledger.done()
            for creq in request.container_requests:
                ids = None
                if len(waiting) == 1 and waiting[0].assignment is not None:
                    ids = prefer.assigned(info, waiting[0], done, creq, self.ledger, self._rm)
                if ids is None:
                    ids = prefer.fallback(
                        info,
                        list(creq.available_deviceIDs),
                        list(creq.must_include_deviceIDs),
                        creq.allocation_size,
                        self.ledger,
                        self._rm,
                    )
                out.container_responses.append(
                    api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids)
                )
        return out

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
        waiting, pods, seen, namesake = await self._admission.admitting()
        if namesake is not None:
            raise self._admission.refuse_namesake(waiting[0].pod, namesake, self._node)
        try:
            w = one_pod(waiting, self._node, info.name, len(ids), seen)
            container, part = resolve_call(w, info, ids, self.ledger, self._protocol, self._node)
        except AllocationError:
            # A kubelet that lost its checkpoint asks again for a running container's devices.
            repeated = await self._repeated(info, ids, pods, waiting)
            if repeated is not None:
                return repeated
            if len(waiting) == 1:
                self._refused.add(waiting[0].pod)
            raise
        pod = w.pod
        held = self.ledger.entries.get(f"{pod.uid}/{container.name}")
        if held is not None:
            mine = tuple(s for s in held.shares if info.name in self.ledger.resource_of(s))
            if mine and set(mine) != set(part):
                self._refused.add(pod)
                raise AllocationError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"pod {pod.ref} container {container.name} holds {describe(mine)} for"
                    f" {info.name} from an earlier call, but the kubelet now passes"
                    f" {describe(part)}",
                )
            shares = held.shares if mine else (*held.shares, *part)
        else:
            assignment = w.assignment or {}
            others = tuple(
                s
                for s in assignment.get(container.name, ())
                if info.name not in self.ledger.resource_of(s)
            )
            shares = (*part, *others)
        try:
            response = await runtime_allocate(self._runtime, pod, container, shares)
        except AllocationError:
            self._refused.add(pod)
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
            self.ledger.entries[held.key] = held
        held.called.add(info.name)
        if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
            held.units[info.name] = tuple(ids)
        log.info(
            "allocated",
            extra={
                "pod": pod.ref,
                "container": container.name,
                "resource": info.name,
                "devices": describe(part),
            },
        )
        self._record(pod)
        return container_response(response.spec)

    async def _repeated(
        self,
        info: ResourceInfo,
        ids: Sequence[str],
        pods: Sequence[PodInfo],
        waiting: list[Waiting],
    ) -> api_pb2.ContainerAllocateResponse | None:
        """A kubelet that lost its checkpoint asks again for a running container's devices.

        When no pod waits for the call's resource (else the call may be that pod's, the
        kubelet passing devices it takes for free) and exactly one allocated container of
        an active pod holds exactly these IDs, answer its spec again (the Runtime's Allocate
        is idempotent per container key) instead of failing a running pod. For a slice the
        IDs are the units the kubelet passed for it; after a restart of the plugin, which
        does not know them, its device and percentage. Nothing new is handed out.
        """
        done = self.ledger.done()
        if any(next_container(w.pod, info.name, done) is not None for w in waiting):
            return None
        sliced = info.kind in (ResourceKind.CORE, ResourceKind.MEMORY)
        unserved = {w.pod.uid for w in waiting}
        active = {p.uid: p for p in pods if p.active and p.uid not in unserved}
        matches = [
            held
            for held in self.ledger.entries.values()
            if info.name in held.called
            and held.pod_uid in active
            and self._holds_exactly(held, info.name, ids, sliced)
        ]
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
        response = await runtime_allocate(self._runtime, pod, container, held.shares)
        return container_response(response.spec)

    def _holds_exactly(self, held: Held, resource: str, ids: Sequence[str], sliced: bool) -> bool:
        """Whether the container holds exactly these IDs of `resource`."""
        if not sliced:
            mine = {s.device_id for s in held.shares if resource in self.ledger.resource_of(s)}
            return mine == set(ids)
        units = held.units.get(resource)
        if units is not None:
            return set(units) == set(ids)
        parents = {slice_unit_device(u) for u in ids}
        return {s.device_id for s in held.shares if not s.whole} == parents

    # records and clean-up

    def _record(self, pod: PodInfo) -> None:
        record(self._recorder, pod, self.ledger, self._rm.resources(), self._protocol)

    async def collect(self) -> None:
        """One clean-up round outside Allocate (the periodic loop calls it)."""
        try:
            pods = await self._pods.list_pods()
        except PodLookupError as exc:
            log.warning("clean-up skipped", extra={"reason": str(exc)})
            return
        async with self._lock:
            await self._collector.release_finished(pods, fresh=False)
            if self.ledger.missing():
                fresh = await self._admission.fresh()
                if fresh is not None:
                    await self._collector.release_finished(fresh, fresh=True)
            await self.cross_check(pods)

    async def cross_check(self, pods: Sequence[PodInfo]) -> list[Difference]:
        """Compare the kubelet's PodResources record with the ledger (`CrossCheck.run`)."""
        return await self._crosscheck.run(pods)

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
