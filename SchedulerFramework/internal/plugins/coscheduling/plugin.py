"""Coscheduling: all-or-nothing placement of gangs, in the network domain that fits them.

Cycle order (scheduler-plugins' Coscheduling, plus a gang-wide plan):

- PreFilter: the pod's gang (gang.py; a bad definition is an unresolvable
  reason). A gang backing off, or with fewer members created than its
  minimum, waits. Otherwise the first member plans the *whole* remaining gang
  against the capacity that is free now and not claimed by another gang
  (networktopology/placement.py: the smallest domain that holds it). No plan,
  no reservation: the member stays Pending with the reason, and a GangNeed in
  the cycle state lets DefaultPreemption make room for the whole gang (it
  then claims the nodes through `hold`). The plan claims its nodes; each
  member is narrowed to its Job's planned nodes.
- Filter: a node claimed by a gang being placed holds the room of the members
  still to come there (as nominated pods hold theirs): another pod passes when
  it fits beside them, or when its priority is higher than theirs.
- Reserve: the member takes one planned slot (GpuShare reserves the devices).
- Permit: WAIT until running + reserved members reach the minimum, then every
  waiting member is allowed at once and all bind. The wait ends at the plan's
  deadline (the gang timeout); the first member to time out releases every
  reserved member of the gang (Unreserve) and the gang backs off.

Deadlock rule (README "Gang scheduling"): a gang reserves nothing until the
whole remaining gang fits in capacity that is free and unclaimed, and plans
are made one at a time by the single scheduling thread in queue order
(priority, then age), so two gangs never hold parts of the same capacity; what
a gang claims or reserves is released at its timeout at the latest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge

from lj_runtimekit.proto.pkg.featuregate import FEATURE_MINIMUMS, Feature, evaluate
from lj_runtimekit.proto.pkg.kube import KubeError
from lj_runtimekit.proto.pkg.version import InvalidVersionError
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.args import (
    ArgsError,
    boolean,
    check_fields,
)
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    FilterPlugin,
    Handle,
    PermitPlugin,
    PodEventPlugin,
    PreFilterPlugin,
    ReservePlugin,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    Code,
    CycleState,
    PreFilterResult,
    Status,
    unresolvable,
    unschedulable,
)
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling.gang import (
    EXCLUSIVE_TOPOLOGY,
    JOBSET_NAME,
    GangError,
    GangSpec,
    gang_of,
    jobset_size,
)
from lj_runtimekit.schedulerframework.internal.plugins.dynamicresources import (
    claim_awaited,
    claim_copies,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.assign import copies_that_fit
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import device_request
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import RequestError
from lj_runtimekit.schedulerframework.internal.plugins.networktopology.placement import (
    Candidate,
    PlacementError,
    Plan,
    plan,
)

if TYPE_CHECKING:
    from lj_runtimekit.schedulerframework.internal.config.config import Config

log = logging.getLogger(__name__)

NAME = "Coscheduling"
STATE_KEY = "Coscheduling/gang"
NEED_KEY = "Coscheduling/need"
"""Cycle state key of the GangNeed written when a gang's plan finds no room."""
JOBSET_API = "/apis/jobset.x-k8s.io/v1alpha2"
JOBSET_CACHE_S = 30.0

WAITING_GANGS = Gauge(
    "lj_scheduler_waiting_gangs",
    "Gangs with members reserved and waiting at Permit for the rest of the gang.",
)
WAITING_MEMBERS = Gauge(
    "lj_scheduler_gang_waiting_members",
    "Gang members reserved (devices held) and waiting at Permit.",
)


@dataclass(frozen=True)
class Args:
    default_timeout_seconds: float = 60.0
    """How long reserved members wait for the rest (annotation gang_timeout_seconds overrides)."""
    backoff_seconds: float = 10.0
    """How long a gang that timed out waits before it is tried again."""
    require_job_set: bool = False
    """JobSet (>= v0.8.0) must be installed: deploy-all.sh precheck reads this; the scheduler
    checks the CRD at start."""

    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ("defaultTimeoutSeconds", "backoffSeconds", "requireJobSet"))
        out = {}
        for key, default in (("defaultTimeoutSeconds", 60.0), ("backoffSeconds", 10.0)):
            value = raw.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ArgsError(
                    f"pluginConfig {NAME}: args.{key} must be a number of seconds > 0, "
                    f"got {value!r}"
                )
            out[key] = float(value)
        return Args(
            default_timeout_seconds=out["defaultTimeoutSeconds"],
            backoff_seconds=out["backoffSeconds"],
            require_job_set=boolean(NAME, raw, "requireJobSet", False),
        )


@dataclass
class _Plan:
    slots: dict[str, dict[str, int]]
    deadline: float
    how: str
    gate_note: str = ""
    used: dict[str, dict[str, int]] = field(default_factory=dict)
    member_at: dict[str, tuple[str, str]] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)
    """members sent to the planned nodes (a member tried and not reserved did not fit)"""
    preempting: bool = False
    """made by a preemption: its nodes hold the gang's room while the victims go"""

    def free_nodes(self, job: str) -> list[str]:
        used = self.used.get(job, {})
        return [n for n, c in self.slots.get(job, {}).items() if used.get(n, 0) < c]

    def node_full(self, node: str) -> bool:
        return all(
            self.used.get(job, {}).get(node, 0) >= nodes.get(node, 0)
            for job, nodes in self.slots.items()
        )


@dataclass(frozen=True)
class _Unmet:
    """A plan that was not met by its timeout: made again unchanged, it would fail again."""

    slots: dict[str, dict[str, int]]
    node_generation: int
    """The nodes as they were (Cache.node_generation): a node change may let it be met."""
    reason: str


@dataclass
class _Gang:
    key: str
    spec: GangSpec | None = None
    members: dict[str, PodInfo] = field(default_factory=dict)
    reserved: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)
    permitted: set[str] = field(default_factory=set)
    plan: _Plan | None = None
    backoff_until: float = 0.0
    backoff_reason: str = ""
    releasing: bool = False
    max_size: int | None = None
    failed: tuple[object, Status] | None = None
    """(cluster state, status) of the last failed plan"""
    unmet: _Unmet | None = None
    """The last plan, if it was not met; forgotten when the gang's members change"""
    awaiting_claims: bool = False
    """Members were turned away because a member's ResourceClaims were not there yet"""

    def forget_failures(self) -> None:
        """The gang's members changed: a failed or unmet plan may go otherwise now."""
        self.failed = None
        self.unmet = None

    def placed(self) -> int:
        running = {u for u, p in self.members.items() if p.node_name}
        return len(running | self.reserved)

    def running_nodes(self) -> set[str]:
        return {p.node_name for p in self.members.values() if p.node_name}

    def pending(self) -> list[PodInfo]:
        return [
            p
            for u, p in self.members.items()
            if not p.node_name and u not in self.reserved and not p.deleting
        ]


@dataclass(frozen=True)
class GangPlacement:
    """Where a gang's members still to place go: slots per job and node, and each member's
    node (member uid -> node)."""

    slots: Plan
    how: str
    nodes: Mapping[str, str]


@dataclass(frozen=True)
class GangNeed:
    """A gang whose plan found no room (in the cycle state, under NEED_KEY): what
    DefaultPreemption needs to make room for the whole gang."""

    key: str
    members: tuple[PodInfo, ...]
    """The members not placed yet."""
    place: Callable[[], GangPlacement | None]
    """Where the gang goes on the cache as it is now (None: it does not fit). Caller holds
    the cache lock."""
    hold: Callable[[GangPlacement], None]
    """Claims the placement's nodes for the gang (a plan that waits for the victims)."""


def gang_key(pod: PodInfo, group_annotation: str) -> str | None:
    """The gang a pod belongs to (cheap: no size lookups)."""
    group = pod.annotations.get(group_annotation)
    if group is not None and group.strip():
        return f"{pod.namespace}/{group.strip()}"
    jobset = pod.labels.get(JOBSET_NAME)
    return f"{pod.namespace}/{jobset}" if jobset else None


class Coscheduling(PodEventPlugin, PreFilterPlugin, FilterPlugin, ReservePlugin, PermitPlugin):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args
        self.handle = handle
        self.protocol = handle.protocol
        self._gangs: dict[str, _Gang] = {}
        self._claims: dict[str, str] = {}
        """node -> gang whose plan holds it"""
        self._turned_away: dict[str, set[str]] = {}
        """gang -> pods its claims kept off a node (tried again when a claim of it goes)"""
        self._jobsets: dict[tuple[str, str], tuple[int | None, float]] = {}
        self._gates: dict[str, str | None] = {}
        self._lock = threading.RLock()

    # -- gang bookkeeping -----------------------------------------------------------------

    def _jobset_size(self, namespace: str, name: str) -> int | None:
        now = time.monotonic()
        cached = self._jobsets.get((namespace, name))
        if cached is not None and now - cached[1] < JOBSET_CACHE_S:
            return cached[0]
        size: int | None = None
        try:
            obj = self.handle.get_json(f"{JOBSET_API}/namespaces/{namespace}/jobsets/{name}")
        except KubeError as exc:
            log.warning("cannot read JobSet %s/%s: %s", namespace, name, exc)
            obj = None
        if obj is not None:
            size = jobset_size(obj)
        self._jobsets[(namespace, name)] = (size, now)
        return size

    def spec_of(self, pod: PodInfo) -> GangSpec | None:
        cached = pod.extra.get(NAME)
        if isinstance(cached, GangError):
            raise cached
        if isinstance(cached, GangSpec) or NAME in pod.extra:
            return cached if isinstance(cached, GangSpec) else None
        try:
            spec = gang_of(pod, self.protocol, self.args.default_timeout_seconds, self._jobset_size)
        except GangError as exc:
            pod.extra[NAME] = exc
            raise
        pod.extra[NAME] = spec
        return spec

    def on_pod_event(self, etype: str, pod: PodInfo) -> None:
        key = gang_key(pod, self.protocol.annotations.gang_group)
        if key is None:
            return
        with self._lock:
            g = self._gangs.get(key)
            if etype == "DELETED" or pod.terminal:
                if g is None:
                    return
                if g.members.pop(pod.uid, None) is not None:
                    g.forget_failures()
                if pod.uid not in g.waiting:
                    g.reserved.discard(pod.uid)
                g.permitted.discard(pod.uid)
                if not g.members and not g.reserved:
                    self._drop_plan(g)
                    del self._gangs[key]
                return
            if g is None:
                g = self._gangs[key] = _Gang(key)
            new = pod.uid not in g.members
            if new or g.members[pod.uid].claims_made != pod.claims_made:
                g.forget_failures()  # a member, or the claims made for one, came
            g.members[pod.uid] = pod
            if pod.node_name:
                g.reserved.discard(pod.uid)
                g.waiting.discard(pod.uid)
                g.permitted.discard(pod.uid)
            elif new and g.spec is not None and len(g.members) >= g.spec.min_members:
                # the member the others were waiting for: try them all now
                others = [u for u, p in g.members.items() if not p.node_name and u != pod.uid]
                self.handle.activate(others)

    def _gang(self, pod: PodInfo, spec: GangSpec) -> _Gang:
        g = self._gangs.get(spec.key)
        if g is None:
            g = self._gangs[spec.key] = _Gang(spec.key)
        g.spec = spec
        if pod.uid not in g.members and not pod.node_name:
            g.members[pod.uid] = pod
        return g

    def _drop_plan(self, g: _Gang, why: str = "") -> None:
        """Forget the gang's plan and its claims; `why` (not complete): an event on the
        members not bound yet says so."""
        if g.plan is None:
            return
        dropped = 0
        for nodes in g.plan.slots.values():
            for n in nodes:
                if self._claims.get(n) == g.key:
                    del self._claims[n]
                    dropped += 1
        g.plan = None
        self._retry_turned_away(g.key)
        if why:
            message = (
                f"gang {g.key}: placement plan dropped ({why}); its claims on {dropped} "
                "node(s) released"
            )
            for p in list(g.members.values()):
                if not p.node_name:
                    self.handle.event(p, "Normal", "GangPlanDropped", message)

    def _retry_turned_away(self, key: str) -> None:
        """A claim of the gang went: the pods its claims kept off nodes are tried again now,
        not at the periodic flush of unschedulable pods."""
        turned_away = self._turned_away.pop(key, None)
        if turned_away:
            self.handle.move_to_active_or_backoff(turned_away)

    def _gc(self, now: float) -> None:
        for g in list(self._gangs.values()):
            if g.plan is not None and g.plan.deadline < now and not g.waiting:
                self._plan_unmet(g, None)
                self._drop_plan(g, "its timeout passed with no member waiting")

    def _plan_unmet(self, g: _Gang, reserved: str | None) -> None:
        """The gang's plan is dropped at its timeout: remember it as not met when members
        were tried on it and did not fit (members that had no turn yet prove nothing);
        `reserved`: a member that was reserved until just now."""
        if g.plan is None or g.plan.preempting:
            return  # a preemption's victims may still be going: its members prove nothing
        unfit = sorted(p.key for p in g.pending() if p.uid in g.plan.tried and p.uid != reserved)
        if not unfit:
            return
        shown = ", ".join(unfit[:3]) + (f" and {len(unfit) - 3} more" if len(unfit) > 3 else "")
        g.unmet = _Unmet(
            {job: dict(nodes) for job, nodes in g.plan.slots.items()},
            self.handle.cache.node_generation,
            f"gang {g.key}: the placement planned last was not met by its timeout ({shown} did "
            "not fit the planned nodes) and would be planned again unchanged; waiting for a "
            "change of the gang's members or of the nodes",
        )

    def _update_gauges(self) -> None:
        WAITING_GANGS.set(sum(1 for g in self._gangs.values() if g.waiting))
        WAITING_MEMBERS.set(sum(len(g.waiting) for g in self._gangs.values()))

    # -- topology and capacity ------------------------------------------------------------

    def _gate(self, node: NodeInfo) -> str | None:
        """None when the node's Runtime supports topology-aware gangs, else why not."""
        key = self.protocol.labels.runtime_version
        version = node.labels.get(key)
        if version is None:
            return f"node {node.name} has no label {key}"
        if version not in self._gates:
            try:
                report = evaluate(version)
            except InvalidVersionError as exc:
                self._gates[version] = f"label {key}: {exc}"
            else:
                self._gates[version] = (
                    None
                    if report.is_enabled(Feature.TOPOLOGY_GANG)
                    else f"runs Runtime {version}; feature {Feature.TOPOLOGY_GANG} needs "
                    f"{FEATURE_MINIMUMS[Feature.TOPOLOGY_GANG]}"
                )
        reason = self._gates[version]
        return None if reason is None else f"node {node.name} {reason}"

    def _slots(self, pod: PodInfo, node: NodeInfo, need: int) -> int:
        """How many copies of `pod` fit on the node now (it passed the filters: >= 1): its
        free cpu, memory, pods and devices, the devices counted one by one (a slice or MIG
        pod, or one with ResourceClaims: at most `need`, the members still to place)."""
        n = 1 << 20
        for r, v in pod.requests.items():
            if v > 0 and r in node.allocatable:
                n = min(n, (node.allocatable[r] - node.requested.get(r, 0)) // v)
        try:
            req = device_request(pod, self.handle)
        except RequestError:
            req = None
        if req is not None and req.only_whole:
            kind = req.asks[0].kind
            n = min(n, self.handle.cache.free_whole(kind, node.name) // req.whole_total[kind])
        elif req is not None:
            policy = req.policy_override or "binpack"
            n = copies_that_fit(node.devices, req, policy, min(n, need))
        claims = claim_copies(self.handle.cache.dra, pod, node.name, min(n, need))
        if claims is not None:  # its ResourceClaims: as many copies as the devices hold
            n = min(n, claims)
        return max(n, 1)

    def _max_size(self, pod: PodInfo) -> int | None:
        """Members like `pod` the whole cluster could hold when empty (None: not computed)."""
        try:
            req = device_request(pod, self.handle)
        except RequestError:
            return None
        if req is None or not req.only_whole:
            return None
        kind = req.asks[0].kind
        k = req.whole_total[kind]
        return sum(n.devices.whole_capacity(kind) // k for n in self.handle.cache.node_infos())

    def _exclusive_domains(self, own: str) -> dict[tuple[str, str], str]:
        """(label key, value) -> job, for domains other gangs' exclusive jobs hold."""
        nodes = self.handle.cache.nodes
        out: dict[tuple[str, str], str] = {}
        for g in self._gangs.values():
            spec = g.spec
            if g.key == own or spec is None or spec.exclusive_key is None:
                continue
            key = spec.exclusive_key
            where = set(g.running_nodes())
            if g.plan is not None:
                where |= {n for ns in g.plan.slots.values() for n in ns}
            for u in g.reserved:
                p = g.members.get(u)
                st = self.handle.cache.pods.get(u)
                if st is not None:
                    where.add(st.node)
                elif p is not None and p.node_name:
                    where.add(p.node_name)
            for n in where:
                info = nodes.get(n)
                if info is not None and key in info.labels:
                    out[(key, info.labels[key])] = g.key
        return out

    def _placement(
        self, pod: PodInfo, g: _Gang, spec: GangSpec, need: int
    ) -> tuple[Plan, str, str, list[PodInfo]]:
        """(slots, how, topology note, the members placed) for the `need` members still to
        place, on the capacity free now and not claimed by another gang; PlacementError
        when there is no room."""
        pending = g.pending()
        by_job: Counter[str] = Counter()
        reps: dict[str, PodInfo] = {}
        chosen: list[PodInfo] = []
        for p in sorted(pending, key=lambda p: (p.uid != pod.uid, p.name)):
            job = self._job(p)
            reps.setdefault(job, p)
        for p in sorted(pending, key=lambda p: (self._job(p), p.name)):
            if len(chosen) >= need:
                break
            by_job[self._job(p)] += 1
            chosen.append(p)
        held_exclusive = self._exclusive_domains(g.key)
        cands: dict[str, dict[str, int]] = {}
        infos: dict[str, NodeInfo] = {}
        for job in by_job:
            for node in self.handle.filter_nodes(reps[job], skip=NAME):
                owner = self._claims.get(node.name)
                if owner is not None and owner != g.key:
                    continue
                if any((k, node.labels.get(k)) in held_exclusive for k, _ in held_exclusive):
                    continue
                infos[node.name] = node
                cands.setdefault(node.name, {})[job] = self._slots(reps[job], node, need)
        a = self.protocol.labels
        candidates = [
            Candidate(
                n,
                slots,
                infos[n].labels.get(a.topology_block),
                infos[n].labels.get(a.topology_switch),
                infos[n].labels,
            )
            for n, slots in sorted(cands.items())
        ]
        gated = {c.name: self._gate(infos[c.name]) for c in candidates}
        off = [r for r in gated.values() if r is not None]
        required = spec.topology == "required"
        busy: set[str] = set()
        if spec.exclusive_key:
            busy = self._busy_exclusive(spec.exclusive_key, g.key, held_exclusive)
        anchors = g.running_nodes()
        if not off:
            slots, how = plan(candidates, by_job, True, required, spec.exclusive_key, busy, anchors)
            return slots, how, "", chosen
        on = [c for c in candidates if gated[c.name] is None]
        try:
            slots, how = plan(on, by_job, True, required, spec.exclusive_key, busy, anchors)
            return slots, how, "", chosen
        except PlacementError:
            note = (
                f"topology-aware gang placement is off ({off[0]}"
                f"{f' and {len(off) - 1} more node(s)' if len(off) > 1 else ''}); "
                "placing the gang all-or-nothing without topology"
            )
            slots, how = plan(candidates, by_job, False, False, None, (), anchors)
            return slots, how, note, chosen

    def _claim(self, g: _Gang, p: _Plan) -> None:
        g.plan = p
        for nodes in p.slots.values():
            for n in nodes:
                self._claims[n] = g.key

    def _make_plan(
        self, state: CycleState, pod: PodInfo, g: _Gang, spec: GangSpec, now: float
    ) -> Status:
        need = spec.min_members - g.placed()
        if need <= 0:
            return SUCCESS
        try:
            slots, how, note, _ = self._placement(pod, g, spec, need)
        except PlacementError as exc:
            state.write(NEED_KEY, self._need(pod, g, spec, need))
            return unschedulable(
                f"gang {g.key}: {g.placed()}/{spec.min_members} members placed, no room for the "
                f"{need} still to place: {exc}"
            )
        unmet = g.unmet
        if (
            unmet is not None
            and unmet.node_generation == self.handle.cache.node_generation
            and unmet.slots == slots
        ):
            return unschedulable(unmet.reason)
        g.unmet = None
        self._claim(g, _Plan(slots, now + spec.timeout_s, how, note))
        claimed = sum(len(nodes) for nodes in slots.values())
        log.info(
            "gang planned",
            extra={"gang": g.key, "members": need, "nodes": claimed, "placement": how},
        )
        self.handle.event(
            pod,
            "Normal",
            "GangPlanned",
            f"gang {g.key}: {need} member(s) planned on {claimed} node(s) ({how}); they reserve "
            f"within {spec.timeout_s:g}s",
        )
        if note:  # said once, with the plan: each member's GangWaiting names the placement
            self.handle.event(pod, "Normal", "GangTopologyOff", note)
        return SUCCESS

    def _need(self, pod: PodInfo, g: _Gang, spec: GangSpec, need: int) -> GangNeed:
        """What DefaultPreemption needs to make room for the gang."""

        def place() -> GangPlacement | None:
            with self._lock:
                try:
                    slots, how, _, chosen = self._placement(pod, g, spec, need)
                except PlacementError:
                    return None
            spots = {
                job: [n for n, c in nodes.items() for _ in range(c)] for job, nodes in slots.items()
            }
            at = {p.uid: spots[self._job(p)].pop(0) for p in chosen}
            return GangPlacement(slots, how, at)

        def hold(placement: GangPlacement) -> None:
            with self._lock:
                if g.plan is not None:
                    return
                g.failed = None
                g.unmet = None
                deadline = time.monotonic() + spec.timeout_s
                self._claim(g, _Plan(placement.slots, deadline, placement.how, preempting=True))
            log.info("gang preempting", extra={"gang": g.key, "placement": placement.how})

        members = tuple(sorted(g.pending(), key=lambda p: p.name))
        return GangNeed(g.key, members, place, hold)

    def _busy_exclusive(self, key: str, own: str, held: Mapping[tuple[str, str], str]) -> set[str]:
        """Values of label `key` that hold pods of other gangs, or are claimed by them."""
        nodes = self.handle.cache.nodes
        busy = {value for (k, value) in held if k == key}
        for g in self._gangs.values():
            if g.key == own:
                continue
            where = g.running_nodes() | {
                st.node for u in g.reserved if (st := self.handle.cache.pods.get(u)) is not None
            }
            for n in where:
                info = nodes.get(n)
                if info is not None and key in info.labels:
                    busy.add(info.labels[key])
        for n, owner in self._claims.items():
            info = nodes.get(n)
            if owner != own and info is not None and key in info.labels:
                busy.add(info.labels[key])
        return busy

    def _job(self, pod: PodInfo) -> str:
        try:
            spec = self.spec_of(pod)
        except GangError:
            return ""
        return spec.job if spec is not None else ""

    # -- PreFilter / Filter ---------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        try:
            spec = self.spec_of(pod)
        except GangError as exc:
            return None, unresolvable(str(exc))
        if spec is None:
            return None, SUCCESS
        with self._lock:
            now = time.monotonic()
            self._gc(now)
            state.write(STATE_KEY, spec.key)
            g = self._gang(pod, spec)
            placed = g.placed()
            if placed >= spec.min_members:
                return None, SUCCESS  # complete (or completing): extra or restarted member
            if g.backoff_until > now:
                return None, unschedulable(
                    f"gang {g.key} is backing off for {g.backoff_until - now:.0f}s after "
                    f"{g.backoff_reason}"
                )
            if g.max_size is None or spec.min_members > g.max_size:
                g.max_size = self._max_size(pod) or 0
            if g.max_size and spec.min_members > g.max_size:
                return None, unresolvable(
                    f"gang {g.key} needs {spec.min_members} members but the whole cluster could "
                    f"hold at most {g.max_size} pods like {pod.key} even when empty"
                )
            created = sum(1 for p in g.members.values() if not p.deleting)
            if created < spec.min_members:
                return None, unschedulable(
                    f"gang {g.key}: {created}/{spec.min_members} members created; waiting for "
                    "the rest"
                )
            if g.plan is None:
                # planned before, the members without their claims would fit nowhere; the
                # messages stay the same while the claims come (a condition written once)
                dra = self.handle.cache.dra
                own = claim_awaited(dra, pod)
                if own is not None or any(claim_awaited(dra, p) for p in g.pending()):
                    g.awaiting_claims = True
                    return None, unschedulable(
                        f"waiting for {own}"
                        if own is not None
                        else f"gang {g.key}: waiting for other members' ResourceClaims"
                    )
                if g.awaiting_claims:
                    # the last claim came: the members turned away for it (whose own pods
                    # may not change again) try now, to their slots or to the gang's refusal
                    g.awaiting_claims = False
                    self.handle.activate([p.uid for p in g.pending() if p.uid != pod.uid])
                # the same cluster state gives the same answer: the gang's other members
                # do not plan again until something changed
                seen = (self.handle.cache.generation, tuple(sorted(self._claims.items())))
                if g.failed is not None and g.failed[0] == seen:
                    return None, g.failed[1]
                status = self._make_plan(state, pod, g, spec, now)
                if not status.ok:
                    g.failed = (seen, status)
                    return None, status
                g.failed = None
            if g.plan is None:
                return None, SUCCESS
            g.plan.tried.add(pod.uid)
            nodes = g.plan.free_nodes(spec.job)
            if not nodes:
                nodes = [n for job in g.plan.slots for n in g.plan.free_nodes(job)]
            if not nodes:
                return None, unschedulable(f"gang {g.key}: no planned slot left for {pod.key}")
            return PreFilterResult(
                list(dict.fromkeys(nodes)), f"node(s) outside gang {g.key}'s placement", 1
            ), SUCCESS

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        """A node claimed by another gang takes the pod when the members still to come
        there fit beside it, or when they have a lower priority than the pod's."""
        owner = self._claims.get(node.name)
        if owner is None or owner == state.read(STATE_KEY):
            return SUCCESS
        with self._lock:
            g = self._gangs.get(owner)
            coming = self._coming(g, node.name) if g is not None else []
        held = [m for m in coming if m.priority >= pod.priority]
        if not held or self.handle.filter_nodes(pod, NAME, (node.name,), held):
            return SUCCESS
        self._turned_away.setdefault(owner, set()).add(pod.uid)
        return unschedulable("node(s) held for a gang being placed")

    def _coming(self, g: _Gang, node: str) -> list[PodInfo]:
        """The members the gang's plan still places on `node` (one per open slot, of the
        slot's job): the room its claim holds."""
        p = g.plan
        if p is None:
            return []
        pending = sorted(g.pending(), key=lambda m: m.name)
        out: list[PodInfo] = []
        for job, nodes in p.slots.items():
            open_slots = nodes.get(node, 0) - p.used.get(job, {}).get(node, 0)
            if open_slots > 0:
                out.extend([m for m in pending if self._job(m) == job][:open_slots])
        return out

    # -- Reserve / Permit -----------------------------------------------------------------

    def reserve(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        key = state.read(STATE_KEY)
        if not isinstance(key, str):
            return SUCCESS
        with self._lock:
            g = self._gangs.get(key)
            if g is None or g.spec is None:
                return SUCCESS
            g.reserved.add(pod.uid)
            p = g.plan
            if p is not None:
                job = g.spec.job
                if p.used.get(job, {}).get(node_name, 0) >= p.slots.get(job, {}).get(node_name, 0):
                    job = next(
                        (
                            j
                            for j, ns in p.slots.items()
                            if p.used.get(j, {}).get(node_name, 0) < ns.get(node_name, 0)
                        ),
                        job,
                    )
                used = p.used.setdefault(job, {})
                used[node_name] = used.get(node_name, 0) + 1
                p.member_at[pod.uid] = (job, node_name)
                if p.node_full(node_name) and self._claims.get(node_name) == key:
                    del self._claims[node_name]
                    self._retry_turned_away(key)
        return SUCCESS

    def unreserve(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        key = state.read(STATE_KEY)
        if not isinstance(key, str):
            return
        with self.handle.cache.lock, self._lock:
            g = self._gangs.get(key)
            if g is None:
                return
            was_waiting = pod.uid in g.waiting
            g.reserved.discard(pod.uid)
            g.waiting.discard(pod.uid)
            if pod.uid in g.permitted:  # a failed bind after the gang was allowed
                g.permitted.discard(pod.uid)
                return
            p = g.plan
            if p is not None and pod.uid in p.member_at:
                job, node = p.member_at.pop(pod.uid)
                p.used[job][node] -= 1
            if was_waiting and not g.releasing:
                deleted = pod.uid not in g.members
                reason = "a member was deleted" if deleted else "its timeout"
                self._release(g, reason, deleted, pod.uid)
            self._update_gauges()

    def _release(self, g: _Gang, reason: str, deleted: bool, member: str) -> None:
        """Every waiting member of the gang gives its reservation back (`member`, whose
        rejection released the gang, already has); the gang backs off."""
        g.releasing = True
        try:
            if not deleted:
                self._plan_unmet(g, member)
            self._drop_plan(g, reason)
            if not deleted:
                g.backoff_until = time.monotonic() + self.args.backoff_seconds
                g.backoff_reason = (
                    f"{reason} with {g.placed()}/{g.spec.min_members if g.spec else '?'} "
                    "members reserved"
                )
                timer = threading.Timer(self.args.backoff_seconds, self._retry, (g.key,))
                timer.daemon = True
                timer.start()
            then = "retrying" if deleted else f"backing off {self.args.backoff_seconds:g}s"
            message = f"gang {g.key} released every reserved member ({reason}); {then}"
            for uid in list(g.waiting):
                w = self.handle.get_waiting_pod(uid)
                if w is not None:
                    w.reject(NAME, message)
            g.waiting.clear()
        finally:
            g.releasing = False
        self._update_gauges()

    def _retry(self, key: str) -> None:
        with self._lock:
            g = self._gangs.get(key)
            uids = [p.uid for p in g.pending()] if g is not None else []
        if uids:
            self.handle.activate(uids)

    def permit(self, state: CycleState, pod: PodInfo, node_name: str) -> tuple[Status, float]:
        key = state.read(STATE_KEY)
        if not isinstance(key, str):
            return SUCCESS, 0.0
        with self._lock:
            g = self._gangs.get(key)
            if g is None or g.spec is None:
                return SUCCESS, 0.0
            spec = g.spec
            placed = g.placed()
            if placed >= spec.min_members:
                waiting = list(g.waiting)
                g.permitted |= set(waiting) | {pod.uid}
                g.waiting.clear()
                self._drop_plan(g)
                self._update_gauges()
                # allowed now, in this cycle: a member's Permit timer firing before the
                # cycle is over finds it allowed (its bind starts when the cycle ends)
                self._allow(waiting)
                return SUCCESS, 0.0
            now = time.monotonic()
            deadline = g.plan.deadline if g.plan is not None else now + spec.timeout_s
            left = deadline - now
            if left <= 0:
                return unschedulable(f"gang {g.key} timed out before this member reserved"), 0.0
            g.waiting.add(pod.uid)
            self._update_gauges()
            self.handle.event(
                pod,
                "Normal",
                "GangWaiting",
                f"{placed}/{spec.min_members} members reserved, waiting up to {left:.0f}s "
                f"(gang {g.key}, placed {g.plan.how if g.plan else 'without a plan'})",
            )
            return Status(Code.WAIT), left

    def _allow(self, uids: list[str]) -> None:
        for uid in uids:
            w = self.handle.get_waiting_pod(uid)
            if w is not None:
                w.allow(NAME)

    def debug_state(self) -> list[dict[str, Any]]:
        """Every gang known, for GET /debug/gangs: its size, members, plan (placement, slots
        per job and node, deadline), claimed nodes, reserved and waiting members, backoff."""
        now = time.monotonic()
        out: list[dict[str, Any]] = []
        with self._lock:
            claimed: dict[str, list[str]] = {}
            for node, key in self._claims.items():
                claimed.setdefault(key, []).append(node)
            for key, g in sorted(self._gangs.items()):
                members = g.members

                def keys(uids: set[str], members: dict[str, PodInfo] = members) -> list[str]:
                    return sorted(members[u].key if u in members else u for u in uids)

                plan: dict[str, Any] | None = None
                if g.plan is not None:
                    plan = {
                        "placement": g.plan.how,
                        "slots": g.plan.slots,
                        "used": g.plan.used,
                        "deadline_in_s": round(g.plan.deadline - now, 1),
                        "topology_note": g.plan.gate_note,
                    }
                out.append(
                    {
                        "gang": key,
                        "min_members": g.spec.min_members if g.spec else None,
                        "members": len(members),
                        "bound": sorted(p.key for p in members.values() if p.node_name),
                        "plan": plan,
                        "claimed_nodes": sorted(claimed.get(key, ())),
                        "reserved": keys(g.reserved),
                        "waiting": keys(g.waiting),
                        "backoff_s": round(max(0.0, g.backoff_until - now), 1),
                        "backoff_reason": g.backoff_reason if g.backoff_until > now else "",
                        "unmet": g.unmet.reason if g.unmet is not None else "",
                    }
                )
        return out

    # -- for tests and the bench ------------------------------------------------------------

    def gang_keys(self) -> list[str]:
        with self._lock:
            return sorted(self._gangs)

    def claims(self) -> dict[str, str]:
        with self._lock:
            return dict(self._claims)


def new(args: Args, handle: Handle) -> Coscheduling:
    return Coscheduling(args, handle)


def require_job_set(config: Config) -> bool:
    """Whether a profile enables Coscheduling with `requireJobSet: true` (deploy precheck)."""
    return any(
        s.name == NAME and isinstance(s.args, Args) and s.args.require_job_set
        for p in config.profiles
        for s in p.plugins
    )


def job_set_problem(config: Config, get_json: Callable[[str], object | None]) -> str | None:
    """Why the scheduler cannot start with this config (None when it can): a profile
    requires JobSets (`requireJobSet: true`) and the API server does not serve their API.
    `get_json` reads a path of the API server (None: not found)."""
    if not require_job_set(config):
        return None
    try:
        served = get_json(JOBSET_API) is not None
    except KubeError as exc:
        return f"cannot check for the JobSet API: {exc}"
    if served:
        return None
    return (
        f"{config.source}: pluginConfig Coscheduling args.requireJobSet is true but the JobSet"
        f" API ({JOBSET_API}) is not served: install JobSet >= v0.8.0"
    )


__all__ = [
    "EXCLUSIVE_TOPOLOGY",
    "JOBSET_API",
    "NAME",
    "NEED_KEY",
    "WAITING_GANGS",
    "Args",
    "Coscheduling",
    "GangNeed",
    "GangPlacement",
    "job_set_problem",
    "new",
    "require_job_set",
]
