"""GpuShare: places pods on specific devices: whole GPUs, TDM slices, MIG instances.

Node-level binpack or spread (args.policy, overridable per pod with the
`annotations.gpu_policy` annotation), device-level the same; the chosen
devices ride on the Binding as the `annotations.assigned_devices` annotation,
with the pod's UID beside it (`ASSIGNED_POD_UID`: a copy on another pod is refused).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.proto.pkg.protocol import BIND_PHASE_ALLOCATING, DRA_MODE, encode_assignment
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID
from lj_runtimekit.schedulerframework.internal.cache.cache import held_shares
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo, whole_kinds
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.args import (
    ArgsError,
    boolean,
    check_fields,
    choice,
    string,
)
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    MAX_NODE_SCORE,
    EnqueueExtensions,
    FilterPlugin,
    Handle,
    PreFilterPlugin,
    ReservePlugin,
    ScorePlugin,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SKIP,
    SUCCESS,
    ClusterEvent,
    CycleState,
    PreFilterResult,
    Status,
    unresolvable,
    unschedulable,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.assign import (
    SetChooser,
    assign,
    fits_one_slice,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import (
    POLICIES,
    ContainerAsk,
    DeviceRequest,
    RequestError,
    parse_device_request,
)

NAME = "GpuShare"
REQUEST_KEY = "GpuShare/request"
"""PodInfo.extra key of the parsed request (or its RequestError)."""
CYCLE_KEY = "GpuShare/cycle"
CHOOSER_KEY = "DeviceTopology/chooser"
"""CycleState key under which DeviceTopology offers its device set chooser."""


@dataclass(frozen=True)
class Args:
    policy: str = "binpack"
    runtime_class_name: str = "lj-runtime"
    warn_missing_runtime_class: bool = True
    ranked_nodes_to_score: int = 64
    """Whole-device pods: the free-device index ranks nodes by policy; score this many feasible
    ones (0: upstream's percentageOfNodesToScore alone)."""

    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(
            NAME,
            raw,
            ("policy", "runtimeClassName", "warnMissingRuntimeClass", "rankedNodesToScore"),
        )
        ranked = raw.get("rankedNodesToScore", 64)
        if isinstance(ranked, bool) or not isinstance(ranked, int) or ranked < 0:
            raise ArgsError(
                f"pluginConfig {NAME}: args.rankedNodesToScore must be an integer >= 0, "
                f"got {ranked!r}"
            )
        return Args(
            policy=choice(NAME, raw, "policy", POLICIES, "binpack"),
            runtime_class_name=string(NAME, raw, "runtimeClassName", "lj-runtime"),
            warn_missing_runtime_class=boolean(NAME, raw, "warnMissingRuntimeClass", True),
            ranked_nodes_to_score=ranked,
        )


@dataclass(frozen=True)
class _Cycle:
    """What PreFilter worked out for this cycle, read by Filter and Score for every node."""

    req: DeviceRequest
    policy: str
    whole_kind: str = ""
    """Set when the pod asks for whole devices of one kind only (the indexed fast path)."""
    whole_count: int = 0
    single_slice: ContainerAsk | None = None
    """Set when the pod is one container asking for one slice (a scan instead of `assign`)."""


def device_request(pod: PodInfo, handle: Handle) -> DeviceRequest | None:
    """The pod's device request, parsed once per pod object (RequestError when malformed)."""
    cached = pod.extra.get(REQUEST_KEY)
    if isinstance(cached, RequestError):
        raise cached
    if cached is not None or REQUEST_KEY in pod.extra:
        return cached if isinstance(cached, DeviceRequest) else None
    try:
        req = parse_device_request(pod, handle.protocol)
    except RequestError as exc:
        pod.extra[REQUEST_KEY] = exc
        raise
    pod.extra[REQUEST_KEY] = req
    return req


class GpuShare(PreFilterPlugin, FilterPlugin, ScorePlugin, ReservePlugin, EnqueueExtensions):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args
        self.handle = handle
        self.protocol = handle.protocol
        self.resource_of = {kind: res for res, kind in whole_kinds(self.protocol).items()}
        self._warned: dict[str, None] = {}

    def events_to_register(self) -> frozenset[str]:
        return frozenset(
            {
                ClusterEvent.NODE_ADD,
                ClusterEvent.NODE_ALLOCATABLE,
                ClusterEvent.POD_DELETE,
                ClusterEvent.POD_DEVICES,
            }
        )

    # -- PreFilter ------------------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        try:
            req = device_request(pod, self.handle)
        except RequestError as exc:
            return None, unresolvable(str(exc))
        if req is None:
            return None, SKIP
        self._check_runtime_class(pod)
        policy = req.policy_override or self.args.policy
        cache = self.handle.cache
        for kind, total in req.whole_total.items():
            largest = cache.max_whole_capacity(kind)
            if total > largest:
                return None, unresolvable(
                    f"pod asks for {total} {self.resource_of[kind]} in all but the largest node "
                    f"has {largest}{self._dra_note()}"
                )
        if req.only_whole:
            kind = req.asks[0].kind
            total = req.whole_total[kind]
            state.write(CYCLE_KEY, _Cycle(req, policy, kind, total))
            names = cache.nodes_with_free(kind, total, ascending=policy == "binpack")
            reason = f"Insufficient {self.resource_of[kind]}"
            return PreFilterResult(names, reason, self.args.ranked_nodes_to_score), SUCCESS
        single = req.asks[0] if len(req.asks) == 1 and req.only_slices else None
        state.write(CYCLE_KEY, _Cycle(req, policy, single_slice=single))
        profiles = req.mig_profiles()
        if profiles:
            missing = sorted(p for p in profiles if not cache.mig_nodes.get(p))
            if missing:
                names_missing = ", ".join(self.protocol.resources.mig(p) for p in missing)
                return None, unschedulable(f"no node offers MIG instances {names_missing}")
            if all(a.mig for a in req.asks):
                sets = [cache.mig_nodes[p] for p in profiles]
                nodes = sorted(set.intersection(*sets))
                return PreFilterResult(nodes, "node(s) had no free MIG instance asked for"), SUCCESS
        if req.only_slices:
            smallest = min(a.core for a in req.asks)
            names = cache.nodes_with_slice_room(smallest, ascending=policy == "binpack")
            reason = "node(s) had no GPU with the asked core and memory percentage free"
            return PreFilterResult(names, reason, self.args.ranked_nodes_to_score), SUCCESS
        return None, SUCCESS

    def _dra_note(self) -> str:
        """Why some nodes offer no device: they serve theirs through DRA."""
        count = len(self.handle.cache.dra_nodes)
        if not count:
            return ""
        label = self.protocol.labels.device_api
        return (
            f" ({count} node(s) serve devices through DRA, label {label}={DRA_MODE}: device "
            "pods there need ResourceClaims and the default scheduler)"
        )

    def _check_runtime_class(self, pod: PodInfo) -> None:
        if not self.args.warn_missing_runtime_class:
            return
        if pod.runtime_class == self.args.runtime_class_name or pod.uid in self._warned:
            return
        self._warned[pod.uid] = None
        if len(self._warned) > 10000:
            self._warned.pop(next(iter(self._warned)))
        shown = pod.runtime_class or "not set"
        self.handle.event(
            pod,
            "Warning",
            "MissingRuntimeClass",
            f"pod asks for device resources but its runtimeClassName is {shown}, not "
            f"{self.args.runtime_class_name}: its devices would not be injected",
        )

    # -- Filter / Score -------------------------------------------------------------------

    @staticmethod
    def _cycle(state: CycleState) -> _Cycle:
        cycle = state.read(CYCLE_KEY)
        assert isinstance(cycle, _Cycle)
        return cycle

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        c = self._cycle(state)
        if c.whole_kind:
            if self.handle.cache.free_whole(c.whole_kind, node.name) >= c.whole_count:
                return SUCCESS
            return unschedulable(f"Insufficient {self.resource_of[c.whole_kind]}")
        if c.single_slice is not None:
            if fits_one_slice(node.devices, c.single_slice):
                return SUCCESS
        elif assign(node.devices, c.req, c.policy) is not None:
            return SUCCESS
        return unschedulable(self._shortage(c.req))

    def _shortage(self, req: DeviceRequest) -> str:
        r = self.protocol.resources
        if req.only_slices:
            return "node(s) had no GPU with the asked core and memory percentage free"
        if req.mig_profiles() and all(a.mig for a in req.asks):
            return "node(s) had no free MIG instance asked for"
        return f"Insufficient devices ({r.gpu}, slices or MIG instances)"

    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        c = self._cycle(state)
        if c.whole_kind:
            total = node.devices.whole_capacity(c.whole_kind)
            used = total - self.handle.cache.free_whole(c.whole_kind, node.name)
        else:
            used, total = node.devices.used_units()
        if total <= 0:
            return 0
        packed = used * MAX_NODE_SCORE // total
        return packed if c.policy == "binpack" else MAX_NODE_SCORE - packed

    # -- Reserve --------------------------------------------------------------------------

    def reserve(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        c = state.read(CYCLE_KEY)
        if not isinstance(c, _Cycle):
            return SUCCESS
        req, policy = c.req, c.policy
        cache = self.handle.cache
        chooser = state.read(CHOOSER_KEY)
        with cache.lock:
            node = cache.nodes.get(node_name)
            if node is None:
                return unschedulable(f"node {node_name} is gone")
            choose: SetChooser | None = chooser if callable(chooser) else None
            result = assign(node.devices, req, policy, choose)
            if result is None:
                return unschedulable(self._shortage(req))
            cache.reserve_devices(pod.uid, node_name, held_shares(pod, result))
            text = encode_assignment(result)
            cache.mark_devices_text(pod.uid, text)
        a = self.protocol.annotations
        state.binding_annotations[a.assigned_devices] = text
        state.binding_annotations[ASSIGNED_POD_UID] = pod.uid
        state.binding_annotations[a.assume_time] = str(time.time_ns())
        state.binding_annotations[a.bind_phase] = BIND_PHASE_ALLOCATING
        state.write(f"{NAME}/assignment", result)
        return SUCCESS

    def unreserve(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        if not isinstance(state.read(CYCLE_KEY), _Cycle):
            return
        self.handle.cache.release_devices(pod.uid, node_name)
        a = self.protocol.annotations
        for key in (a.assigned_devices, ASSIGNED_POD_UID, a.assume_time, a.bind_phase):
            state.binding_annotations.pop(key, None)


def new(args: Args, handle: Handle) -> GpuShare:
    return GpuShare(args, handle)
