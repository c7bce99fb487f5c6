"""DynamicResources: allocates the pod's ResourceClaims (resource.k8s.io/v1) on the driver's
devices, as kube-scheduler's plugin of that name does (docs/dra.md).

PreFilter resolves the pod's claims (named, or made from a template by the controller
manager for this pod), keeps a node an allocated claim is bound to, and turns away a claim
no node can serve as it is (admin access, a selector that does not compile). Filter
allocates the unallocated claims on the node (`dra/allocator.py`), Score prefers fuller
nodes (whole nodes stay free), Reserve holds the allocation in the cache until the claim
shows it, PreBind writes each claim's `status.allocation` and `reservedFor` in one update
(after the `delete-protection` finalizer; conflicts read the claim again) before the
Binding. A claim already allocated is honoured, a claim shared by several pods is
allocated once. Claims whose devices are not our driver's find no device here and stay
pending, the message saying so: they are kube-scheduler's (`schedulerName`).

A node labelled `labels.device_api` = `dra` serves its devices through DRA, not the Device
Plugin: the cache gives it no device-plugin device, and Filter turns pods asking for
device-plugin resources away from it saying so. In extender mode kube-scheduler allocates
the claims (`CLAIMS_ALLOCATED_ELSEWHERE`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit.proto.pkg.kube import KubeError, api_time
from lj_runtimekit.proto.pkg.protocol import DRA_MODE
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.dra.allocator import (
    ClaimAllocation,
    ClaimProblem,
    allocate,
    candidate_nodes,
    check_claim,
    copies_that_fit,
    node_fullness,
)
from lj_runtimekit.schedulerframework.internal.dra.objects import (
    API,
    DELETE_PROTECTION,
    MAX_RESERVED_FOR,
    Allocation,
    Claim,
    allocation_to_api,
    pod_claim_names,
)
from lj_runtimekit.schedulerframework.internal.dra.state import DraState
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    MAX_NODE_SCORE,
    EnqueueExtensions,
    FilterPlugin,
    Handle,
    PreBindPlugin,
    PreFilterPlugin,
    QueueingHintPlugin,
    ReservePlugin,
    ScorePlugin,
    passes_now,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SKIP,
    SUCCESS,
    UNKNOWN_OUTCOME_STATUSES,
    ClusterEvent,
    Code,
    CycleState,
    PreFilterResult,
    Status,
    error,
    unresolvable,
    unschedulable,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import device_request
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import RequestError

NAME = "DynamicResources"
CLAIMS_ALLOCATED_ELSEWHERE = "DynamicResources/claims-allocated-elsewhere"
"""CycleState key a caller sets when the kube-scheduler allocates the pod's claims (extender
mode): PreFilter then lets a pod with claims through."""
_STATE = "DynamicResources/claims"
RANKED_NODES_TO_SCORE = 64
"""A pod with claims to allocate tries the nodes with room fullest first; this many feasible
ones are enough (as GpuShare's rankedNodesToScore for whole devices)."""
WRITE_ATTEMPTS = 5
"""Tries of a claim's update that conflicts with another writer."""

log = logging.getLogger(__name__)


def claim_names(pod: PodInfo) -> list[str]:
    """The names of the pod's `spec.resourceClaims` entries (empty: it uses no claim)."""
    claims = (pod.obj.get("spec") or {}).get("resourceClaims") or ()
    return [str(c.get("name", "")) if isinstance(c, dict) else str(c) for c in claims]


@dataclass
class _PodClaims:
    claims: list[Claim]
    """the pod's claims, in its spec's order"""
    to_allocate: list[Claim]
    node: str = ""
    """the node its allocated claims are bound to ("": any)"""
    planned: dict[str, list[ClaimAllocation]] = field(default_factory=dict)
    """node -> what Filter allocated there"""
    reserved: list[ClaimAllocation] = field(default_factory=list)


@dataclass(frozen=True)
class Args:
    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ())
        return Args()


class DynamicResources(
    PreFilterPlugin,
    FilterPlugin,
    ScorePlugin,
    ReservePlugin,
    PreBindPlugin,
    EnqueueExtensions,
    QueueingHintPlugin,
):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args
        self.handle = handle
        self.driver = handle.protocol.dra.driver
        label = handle.protocol.labels.device_api
        self.node_reason = (
            f"node(s) serve devices through DRA (label {label}={DRA_MODE}): device pods there "
            "need ResourceClaims"
        )

    def events_to_register(self) -> frozenset[str]:
        return frozenset(
            {
                ClusterEvent.NODE_ADD,
                ClusterEvent.NODE_LABEL,
                ClusterEvent.RESOURCE_CLAIM,
                ClusterEvent.RESOURCE_SLICE,
                ClusterEvent.DEVICE_CLASS,
            }
        )

    def queueing_hint(self, pod: PodInfo, old: NodeInfo | None, new: NodeInfo) -> bool:
        # a pod with claims waits for devices (slice events); a node alone brings none
        return not claim_names(pod) and passes_now(self, pod, old, new)

    # -- PreFilter ----------------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        if not claim_names(pod) or state.read(CLAIMS_ALLOCATED_ELSEWHERE) is not None:
            try:
                asks_devices = device_request(pod, self.handle) is not None
            except RequestError:
                asks_devices = True  # GpuShare's PreFilter says what is wrong with it
            return None, SUCCESS if asks_devices else SKIP
        dra = self.handle.cache.dra
        claims: list[Claim] = []
        to_allocate: list[Claim] = []
        nodes: set[str] = set()
        for entry, name in pod_claim_names(pod.obj):
            if name is None:
                return None, unschedulable(f"waiting for {_unmade(entry)}")
            if not name:
                continue  # the template made no claim for it: nothing to allocate
            claim = dra.claims.get(f"{pod.namespace}/{name}")
            if claim is None:
                return None, unschedulable(f"ResourceClaim {pod.namespace}/{name} not found")
            if claim.deleting:
                return None, unschedulable(f"ResourceClaim {claim.key} is being deleted")
            if not _named_claim(pod, entry) and claim.owner_uid != pod.uid:
                return None, unresolvable(
                    f"ResourceClaim {claim.key} was not made for this pod (its owner is "
                    f"{claim.owner_uid or 'none'})"
                )
            claims.append(claim)
            if claim.allocation is None and claim.uid in dra.assumed:
                # another pod's binding writes its allocation now: the claim's update (an
                # event) brings this pod back, to honour what that one wrote
                return None, unschedulable(
                    f"ResourceClaim {claim.key} is being allocated for another pod"
                )
            allocation = dra.allocation_of(claim)
            if allocation is not None:
                if (
                    pod.uid not in claim.reserved_for
                    and len(claim.reserved_for) >= MAX_RESERVED_FOR
                ):
                    return None, unschedulable(
                        f"ResourceClaim {claim.key} is in use by {MAX_RESERVED_FOR} consumers"
                    )
                if allocation.node:
                    nodes.add(allocation.node)
                continue
            try:
                problem = check_claim(claim, dra)
            except ClaimProblem as exc:
                return None, unresolvable(str(exc))
            if problem is not None:
                return None, unschedulable(problem)
            if claim not in to_allocate:
                to_allocate.append(claim)
        if len(nodes) > 1:
            where = ", ".join(sorted(nodes))
            return None, unresolvable(
                f"the pod's ResourceClaims are allocated on different nodes ({where})"
            )
        pod_claims = _PodClaims(claims, to_allocate, next(iter(nodes), ""))
        state.write(_STATE, pod_claims)
        if pod_claims.node:
            return PreFilterResult(
                [pod_claims.node], "node(s) did not match the node of the pod's allocated claims"
            ), SUCCESS
        if to_allocate:
            candidates = candidate_nodes(dra, to_allocate)
            if not candidates:
                names = ", ".join(c.key for c in to_allocate)
                return None, unschedulable(
                    f"cannot allocate ResourceClaim(s) {names}: no node has a free device of "
                    f"driver {self.driver} they select (claims for other drivers' devices are "
                    "kube-scheduler's)"
                )
            return PreFilterResult(
                candidates,
                f"node(s) had no free device of driver {self.driver} the claims select",
                RANKED_NODES_TO_SCORE,
            ), SUCCESS
        return None, SUCCESS

    # -- Filter, Score ------------------------------------------------------------------

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        pod_claims = state.read(_STATE)
        if not isinstance(pod_claims, _PodClaims):
            return unresolvable(self.node_reason) if node.dra else SUCCESS
        if pod_claims.node and pod_claims.node != node.name:
            return unresolvable(f"the pod's ResourceClaims are allocated on node {pod_claims.node}")
        if not pod_claims.to_allocate:
            return SUCCESS
        planned, why = allocate(self.handle.cache.dra, node.name, pod_claims.to_allocate)
        if planned is None:
            return unschedulable(why or f"no device of driver {self.driver} fits")
        pod_claims.planned[node.name] = planned
        return SUCCESS

    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        pod_claims = state.read(_STATE)
        if not isinstance(pod_claims, _PodClaims) or not pod_claims.to_allocate:
            return 0
        planned = pod_claims.planned.get(node.name, [])
        new = len({r.key for a in planned for r in a.results if not r.share_id})
        return int(node_fullness(self.handle.cache.dra, node.name, new) * MAX_NODE_SCORE)

    # -- Reserve ------------------------------------------------------------------------

    def reserve(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        pod_claims = state.read(_STATE)
        if not isinstance(pod_claims, _PodClaims) or not pod_claims.to_allocate:
            return SUCCESS
        dra = self.handle.cache.dra
        # allocated again, not taken from Filter: since then nominated pods or a gang's
        # other members may have been reserved beside it, or a shared claim allocated
        pending = [c for c in pod_claims.to_allocate if dra.allocation_of(c) is None]
        planned, why = allocate(dra, node_name, pending)
        if planned is None:
            return unschedulable(why)
        for item in planned:
            dra.assume(item.claim, Allocation(node_name, item.results))
        pod_claims.reserved = planned
        return SUCCESS

    def unreserve(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        pod_claims = state.read(_STATE)
        if not isinstance(pod_claims, _PodClaims):
            return
        with self.handle.cache.lock:
            for item in pod_claims.reserved:
                self.handle.cache.dra.forget(item.claim.uid)
        pod_claims.reserved = []

    # -- PreBind ------------------------------------------------------------------------

    def pre_bind(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        pod_claims = state.read(_STATE)
        if not isinstance(pod_claims, _PodClaims):
            return SUCCESS
        mine = {item.claim.uid: item for item in pod_claims.reserved}
        for claim in pod_claims.claims:
            try:
                written = self._write_claim(pod, claim, mine.get(claim.uid), node_name)
            except KubeError as exc:
                # without an answer the update may have landed: the allocation stays held
                # until the claim shows it or the pod's placement expires
                return Status(
                    Code.ERROR,
                    (f"ResourceClaim {claim.key}: {exc.message}",),
                    NAME,
                    exc.status in UNKNOWN_OUTCOME_STATUSES,
                )
            except _Lost as exc:
                return error(str(exc))
            with self.handle.cache.lock:
                self.handle.cache.dra.update_claim(written)
        return SUCCESS

    def _write_claim(
        self, pod: PodInfo, claim: Claim, mine: ClaimAllocation | None, node: str
    ) -> Mapping[str, Any]:
        """Writes the allocation (when this scheduler chose it) and the pod's reservation
        in one status update; the claim's object as written."""
        path = f"{API}/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
        with self.handle.cache.lock:
            obj: Mapping[str, Any] | None = self.handle.cache.dra.claim_objects.get(claim.key)
        for _ in range(WRITE_ATTEMPTS):
            if obj is None:
                obj = self.handle.get_json(path)
                if obj is None:
                    raise _Lost(f"ResourceClaim {claim.key} was deleted")
            meta = obj.get("metadata") or {}
            status = dict(obj.get("status") or {})
            if meta.get("uid") != claim.uid:
                raise _Lost(f"ResourceClaim {claim.key} was deleted and made again")
            reserved = list(status.get("reservedFor") or ())
            reserved_here = any(r.get("uid") == pod.uid for r in reserved)
            current = status.get("allocation")
            if (
                mine is not None
                and current
                and not reserved_here
                and _devices(current) != _devices_of(mine)
            ):
                raise _Lost(f"ResourceClaim {claim.key} was allocated by someone else")
            if mine is None and not current:
                raise _Lost(f"ResourceClaim {claim.key} lost its allocation")
            if reserved_here and current:
                return obj
            try:
                if mine is not None and DELETE_PROTECTION not in (meta.get("finalizers") or ()):
                    updated = dict(obj)
                    updated["metadata"] = {
                        **meta,
                        "finalizers": [*(meta.get("finalizers") or ()), DELETE_PROTECTION],
                    }
                    obj = self.handle.write_json("PUT", path, updated)
                    continue
                if not current and mine is not None:
                    status["allocation"] = allocation_to_api(
                        node, mine.results, mine.config, api_time()
                    )
                if len(reserved) >= MAX_RESERVED_FOR:
                    raise _Lost(
                        f"ResourceClaim {claim.key} is in use by {MAX_RESERVED_FOR} consumers"
                    )
                status["reservedFor"] = [
                    *reserved,
                    {"resource": "pods", "name": pod.name, "uid": pod.uid},
                ]
                return self.handle.write_json("PUT", f"{path}/status", {**obj, "status": status})
            except KubeError as exc:
                if exc.status != 409:
                    raise
                obj = None  # another writer was first: read it again
        raise _Lost(f"ResourceClaim {claim.key}: {WRITE_ATTEMPTS} updates conflicted")


class _Lost(Exception):
    """The claim changed under the scheduler: the attempt is given up."""


def _named_claim(pod: PodInfo, entry: str) -> bool:
    return any(
        c.get("name") == entry and c.get("resourceClaimName")
        for c in (pod.obj.get("spec") or {}).get("resourceClaims") or ()
    )


def _devices(allocation: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in (allocation.get("devices") or {}).get("results") or ()
    }


def _devices_of(item: ClaimAllocation) -> set[tuple[str, str, str]]:
    return {r.key for r in item.results}


def _unmade(entry: str) -> str:
    return f"the ResourceClaim of pod claim {entry} to be made from its template"


def claim_awaited(dra: DraState, pod: PodInfo) -> str | None:
    """What one of the pod's ResourceClaims still waits for (None: each is made and in the
    scheduler's cache)."""
    for entry, name in pod_claim_names(pod.obj):
        if name is None:
            return _unmade(entry)
        if name and f"{pod.namespace}/{name}" not in dra.claims:
            return f"ResourceClaim {pod.namespace}/{name}"
    return None


def claim_copies(dra: DraState, pod: PodInfo, node: str, limit: int) -> int | None:
    """How many pods like `pod`, each with claims like its unallocated ones, the node's
    devices hold (at most `limit`); None when it has no claim to allocate."""
    claims = [
        claim
        for _, name in pod_claim_names(pod.obj)
        if name
        and (claim := dra.claims.get(f"{pod.namespace}/{name}")) is not None
        and dra.allocation_of(claim) is None
    ]
    return copies_that_fit(dra, node, claims, limit) if claims else None


def new(args: Args, handle: Handle) -> DynamicResources:
    return DynamicResources(args, handle)
