"""DefaultPreemption: a pod that fits nowhere makes room by evicting lower-priority pods.

As kube-scheduler's DefaultPreemption PostFilter: on every node where it may
help, the lower-priority pods are taken away (in the cache, under its lock,
then put back), the profile's PreFilter and Filter plugins run for the pod,
and the victims are reprieved one by one, highest priority first (those whose
eviction would break a PodDisruptionBudget before the others), as long as the
pod still fits. The node chosen has the fewest PDB violations, then the
lowest highest-priority victim, the lowest priority sum, the fewest victims.
The pod is nominated to it; the scheduler evicts the victims.

A gang member is a victim only together with every bound member of its gang
(wherever they run), never alone. Pods with `preemptionPolicy: Never`, and
pods whose last preemption still waits for its victims to go, do not preempt.

A gang preempts as a whole, when Coscheduling found no room for its plan (a
GangNeed in the cycle state): every lower-priority unit in the cluster is
taken away and the gang is planned again (the same placement, topology
included); if even then it does not fit, nobody is evicted. Otherwise the
units are reprieved one by one as above (PDB violators first, highest priority
first) while the whole gang still fits (halves of the list first: one plan
reprieves a part that fits back whole). Coscheduling holds the planned nodes
for the gang (a plan of its own, claimed as any gang plan) while the victims
go; on each planned node with victims the first member planned there is
nominated to it and preempts them (the victims of another gang's nodes go with
the first of them).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lj_runtimekit.proto.pkg.kube import KubeError
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo, Requirement
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    Handle,
    PostFilterPlugin,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    Code,
    CycleState,
    Status,
    nodes_unavailable,
    unschedulable,
)
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling.plugin import (
    NEED_KEY,
    GangNeed,
    GangPlacement,
    gang_key,
)
from lj_runtimekit.schedulerframework.internal.plugins.nodeaffinity import requirement_matches

if TYPE_CHECKING:
    from lj_runtimekit.schedulerframework.internal.cache.cache import Cache

log = logging.getLogger(__name__)

NAME = "DefaultPreemption"
PDB_PATH = "/apis/policy/v1/poddisruptionbudgets"
NOTHING = Status(Code.UNSCHEDULABLE)
"""Preemption not tried (no reason added to the pod's failure message)."""
NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
"""Upstream's reasons for a node preemption cannot make room on."""
TERMINATING = "not eligible due to a terminating pod on the nominated node."
"""Upstream's reason: the pod's last preemption still waits for its victims to go."""
MIN_CANDIDATE_NODES_PERCENTAGE = 10
MIN_CANDIDATE_NODES = 100
"""Stop looking once this many nodes would do (upstream's DefaultPreemption args)."""


@dataclass(frozen=True)
class Args:
    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ())
        return Args()


@dataclass(frozen=True)
class Unit:
    """Pods evicted together: one pod, or every bound member of a gang."""

    pods: tuple[PodInfo, ...]

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget: which pods it covers and how many may still go."""

    namespace: str
    match_labels: Mapping[str, str]
    expressions: tuple[Requirement, ...]
    allowed: int
    disrupted: frozenset[str]

    def covers(self, pod: PodInfo) -> bool:
        if pod.namespace != self.namespace:
            return False
        if any(pod.labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(requirement_matches(r, pod.labels.get(r.key)) for r in self.expressions)


def parse_budgets(items: Iterable[Mapping[str, Any]]) -> list[Budget]:
    """policy/v1 PodDisruptionBudgets; one with no or an empty selector covers no pod (as
    kube-scheduler's preemption counts them)."""
    out: list[Budget] = []
    for item in items:
        meta = item.get("metadata") or {}
        selector = (item.get("spec") or {}).get("selector")
        if not isinstance(selector, dict) or not (
            selector.get("matchLabels") or selector.get("matchExpressions")
        ):
            continue
        status = item.get("status") or {}
        expressions = tuple(
            Requirement(
                str(e.get("key", "")), str(e.get("operator", "")), tuple(e.get("values") or ())
            )
            for e in selector.get("matchExpressions") or ()
            if isinstance(e, dict)
        )
        out.append(
            Budget(
                str(meta.get("namespace", "")),
                dict(selector.get("matchLabels") or {}),
                expressions,
                int(status.get("disruptionsAllowed") or 0),
                frozenset(status.get("disruptedPods") or {}),
            )
        )
    return out


def split_by_budgets(units: list[Unit], budgets: list[Budget]) -> tuple[list[Unit], list[Unit]]:
    """(units whose eviction breaks a budget, the others), as upstream's
    filterPodsWithPDBViolation counts: each covered pod takes one allowed disruption."""
    allowed = [b.allowed for b in budgets]
    violating: list[Unit] = []
    fine: list[Unit] = []
    for unit in sorted(units, key=lambda u: -u.priority):
        breaks = False
        for pod in unit.pods:
            for i, b in enumerate(budgets):
                if b.covers(pod) and pod.name not in b.disrupted:
                    allowed[i] -= 1
                    breaks = breaks or allowed[i] < 0
        (violating if breaks else fine).append(unit)
    return violating, fine


class RemovedPods:
    """The pods of some units taken out of the cache while victims are chosen (as a
    context manager: those still out go back into the cache on exit); the ResourceClaims
    made for them are released meanwhile, as the claim controller deallocates them once the
    victim is gone."""

    def __init__(self, cache: Cache, units: Iterable[Unit]) -> None:
        self.cache = cache
        self.out: dict[str, PodInfo] = {}
        self.claims: dict[str, list[str]] = {}
        """pod UID -> the claims made for it, released while it is out"""
        self.take(p for u in units for p in u.pods)

    def take(self, pods: Iterable[PodInfo]) -> None:
        for p in pods:
            if p.uid not in self.out:
                self.out[p.uid] = p
                self.cache.remove_pod(p.uid)
                self.claims[p.uid] = self.cache.dra.release_claims_of(p.uid)

    def put_back(self, pods: Iterable[PodInfo]) -> None:
        for p in pods:
            self.cache.update_pod(p)
            self.cache.dra.restore_claims(self.claims.pop(p.uid, ()))
            del self.out[p.uid]

    def __enter__(self) -> RemovedPods:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.out.values():
            self.cache.update_pod(p)
            self.cache.dra.restore_claims(self.claims.pop(p.uid, ()))


@dataclass(frozen=True)
class Candidate:
    node: str
    victims: tuple[Unit, ...]
    violations: int

    def rank(self) -> tuple[int, int, int, int]:
        pods = [p for u in self.victims for p in u.pods]
        return (
            self.violations,
            max((p.priority for p in pods), default=0),
            sum(p.priority for p in pods),
            len(pods),
        )


def preemption_policy_never(pod: PodInfo) -> bool:
    return (pod.obj.get("spec") or {}).get("preemptionPolicy") == "Never"


class DefaultPreemption(PostFilterPlugin):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args
        self.handle = handle
        self._group = handle.protocol.annotations.gang_group
        self._pdb_warned = False
        self._cycle_budgets: list[Budget] | None = None
        """The PDBs of the preemption being worked out (read when first needed)."""

    def post_filter(
        self, state: CycleState, pod: PodInfo, statuses: Mapping[str, Status]
    ) -> tuple[str | None, Status]:
        need = state.read(NEED_KEY)
        if gang_key(pod, self._group) is not None and not isinstance(need, GangNeed):
            return None, NOTHING  # a gang preempts only when its plan found no room
        if preemption_policy_never(pod):
            return None, unschedulable("not eligible due to preemptionPolicy=Never.")
        if isinstance(need, GangNeed):
            return self._preempt_for_gang(pod, need)
        pending = self.handle.preemption_pending(pod)
        nominated = statuses.get(pending) if pending is not None else None
        if pending is not None and (
            nominated is None or nominated.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        ):  # a nominated node that can never take the pod does not hold it back (upstream)
            return None, unschedulable(TERMINATING)
        cache = self.handle.cache
        # why each node cannot take the pod even by preemption (upstream's wording)
        reasons: Counter[str] = Counter()
        with cache.lock:
            by_node = self._units(pod)
            total = 0
            for info in cache.node_infos():
                total += 1
                s = statuses.get(info.name)
                if s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                    reasons[NOT_HELPFUL] += 1
                elif info.name not in by_node:
                    reasons[NO_VICTIMS] += 1
            nodes = [
                n
                for n in by_node
                if (s := statuses.get(n)) is None or s.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE
            ]
            self._cycle_budgets = None  # read once, when a node first would do
            best: Candidate | None = None
            enough = max(total * MIN_CANDIDATE_NODES_PERCENTAGE // 100, MIN_CANDIDATE_NODES)
            found = 0
            for node in nodes:
                c = self._select_victims(pod, node, by_node[node], reasons)
                if c is None:
                    continue
                if best is None or c.rank() < best.rank():
                    best = c
                found += 1
                if found >= enough:
                    break
        if best is None:
            return None, unschedulable(nodes_unavailable(total, reasons))
        victims = [p for u in best.victims for p in u.pods]
        self.handle.preempt(pod, best.node, victims)
        return best.node, SUCCESS  # as upstream: nothing added to the pod's message

    def _preempt_for_gang(self, pod: PodInfo, need: GangNeed) -> tuple[str | None, Status]:
        if any(self.handle.preemption_pending(m) is not None for m in (pod, *need.members)):
            return None, unschedulable(TERMINATING)
        cache = self.handle.cache
        with cache.lock:
            units = list({id(u): u for us in self._units(pod).values() for u in us}.values())
            if not units:
                return None, NOTHING
            self._cycle_budgets = None
            found = self._select_gang_victims(need, units)
        if found is None:
            return None, unschedulable(
                f"gang {need.key} fits nowhere even without the {len(units)} lower-priority "
                "pod(s) or gang(s) it could preempt."
            )
        placement, victims = found
        need.hold(placement)
        members = {m.uid: m for m in (pod, *need.members)}
        preemptor: dict[str, str] = {}  # node -> the member that preempts there
        for uid, node in sorted(placement.nodes.items(), key=lambda x: members[x[0]].name):
            preemptor.setdefault(node, uid)
        first = next(iter(preemptor.values()))
        by_member: dict[str, list[PodInfo]] = {}
        for v in victims:
            by_member.setdefault(preemptor.get(v.node_name, first), []).append(v)
        for uid, vs in sorted(by_member.items(), key=lambda x: members[x[0]].name):
            self.handle.preempt(members[uid], placement.nodes[uid], vs)
        nodes = sorted({placement.nodes[u] for u in by_member})
        return nodes[0], Status(
            Code.SUCCESS,
            (
                f"gang {need.key} preempting {len(victims)} lower-priority pod(s) on "
                f"{len(nodes)} node(s) ({placement.how}).",
            ),
        )

    def _select_gang_victims(
        self, need: GangNeed, units: list[Unit]
    ) -> tuple[GangPlacement, list[PodInfo]] | None:
        """The fewest units whose eviction lets the whole gang fit, and where it then goes;
        None when even all of them are not enough."""
        with RemovedPods(self.handle.cache, units) as removed:
            if need.place() is None:
                return None
            if self._cycle_budgets is None:
                self._cycle_budgets = self._budgets()
            violating, fine = split_by_budgets(units, self._cycle_budgets)
            victims: list[PodInfo] = []

            def reprieve(batch: list[Unit]) -> None:
                """As reprieving the units one by one, in order, while the gang fits; a
                batch that fits back at once is reprieved with one plan (fitting only
                gets harder as pods come back)."""
                pods = [p for u in batch for p in u.pods]
                removed.put_back(pods)
                if need.place() is not None:
                    return
                removed.take(pods)
                if len(batch) == 1:
                    victims.extend(pods)
                    return
                reprieve(batch[: len(batch) // 2])
                reprieve(batch[len(batch) // 2 :])

            ordered = violating + fine
            if ordered:
                reprieve(ordered)
            placement = need.place()
            if not victims or placement is None:
                return None  # fits as it is (what turned it away was not these pods)
            return placement, victims

    def _units(self, pod: PodInfo) -> dict[str, list[Unit]]:
        """Node -> the victim units with a pod on it: bound, lower-priority pods, not being
        deleted; a gang only when all its bound members are such."""
        singles: dict[str, list[Unit]] = {}
        gangs: dict[str, list[PodInfo]] = {}
        spoiled: set[str] = set()
        nodes = self.handle.cache.nodes
        for st in self.handle.cache.pods.values():
            p = st.pod
            key = gang_key(p, self._group)
            if p.deleting or p.terminal:
                continue
            on = nodes.get(st.node)
            eligible = (
                not st.assumed and p.priority < pod.priority and on is not None and on.present
            )
            if key is not None:
                gangs.setdefault(key, []).append(p)
                if not eligible:
                    spoiled.add(key)
            elif eligible:
                singles.setdefault(st.node, []).append(Unit((p,)))
        for key, members in gangs.items():
            if key in spoiled:
                continue
            unit = Unit(tuple(members))
            for node in dict.fromkeys(m.node_name for m in members):
                singles.setdefault(node, []).append(unit)
        return singles

    def _budgets(self) -> list[Budget]:
        try:
            obj = self.handle.get_json(PDB_PATH)
        except KubeError as exc:
            if not self._pdb_warned:
                self._pdb_warned = True
                log.warning(
                    "PodDisruptionBudgets not read (the scheduler's role needs list on "
                    "policy/poddisruptionbudgets); preempting without them: %s",
                    exc,
                )
            return []
        items = (obj or {}).get("items") or []
        return parse_budgets(i for i in items if isinstance(i, dict))

    def _fits(self, pod: PodInfo, node: str) -> bool:
        return self.handle.filter_status(pod, node).ok

    def _select_victims(
        self, pod: PodInfo, node: str, units: list[Unit], reasons: Counter[str]
    ) -> Candidate | None:
        """The fewest units to evict from `node` for `pod` to fit (upstream's
        selectVictimsOnNode), or None when even all of them are not enough (the node's
        reasons then counted in `reasons`)."""
        with RemovedPods(self.handle.cache, units) as removed:
            status = self.handle.filter_status(pod, node)
            if not status.ok:
                for r in status.reasons or (NOT_HELPFUL,):
                    reasons[r] += 1
                return None
            if self._cycle_budgets is None:
                self._cycle_budgets = self._budgets()
            violating, fine = split_by_budgets(units, self._cycle_budgets)
            victims: list[Unit] = []
            violations = 0
            for unit in violating + fine:  # each part highest priority first
                removed.put_back(unit.pods)
                if self._fits(pod, node):
                    continue  # reprieved
                removed.take(unit.pods)
                victims.append(unit)
                violations += int(unit in violating)
            if not victims:  # fits as it is (what turned it away was not these pods)
                reasons[NO_VICTIMS] += 1
                return None
            return Candidate(node, tuple(victims), violations)


def new(args: Args, handle: Handle) -> DefaultPreemption:
    return DefaultPreemption(args, handle)
