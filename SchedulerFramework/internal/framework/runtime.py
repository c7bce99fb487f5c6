"""Framework: runs the enabled plugins of one profile at each extension point."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    BindPlugin,
    EnqueueExtensions,
    FilterPlugin,
    Handle,
    PermitPlugin,
    Plugin,
    PostBindPlugin,
    PostFilterPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    ReservePlugin,
    ScoreExtensions,
    ScorePlugin,
    check_plugin,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    ALL_EVENTS,
    SKIP,
    SUCCESS,
    Code,
    CycleState,
    PreFilterResult,
    Status,
    error,
    unschedulable,
)

log = logging.getLogger(__name__)

MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE = 5


def num_feasible_nodes_to_find(percentage: int, num_all_nodes: int) -> int:
    """How many feasible nodes to find before scoring (upstream percentageOfNodesToScore)."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    adaptive = percentage
    if adaptive <= 0:
        adaptive = max(50 - num_all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE)
    if adaptive >= 100:
        return num_all_nodes
    return max(num_all_nodes * adaptive // 100, MIN_FEASIBLE_NODES_TO_FIND)


@dataclass(frozen=True)
class EnabledPlugin:
    plugin: Plugin
    weight: int = 1


@dataclass
class Diagnosis:
    """Why nodes were rejected: node name -> status (for the FailedScheduling message)."""

    statuses: dict[str, Status]
    excluded: int = 0
    excluded_reason: str = ""
    excluded_by: tuple[str, ...] = ()
    """The PreFilter plugins that narrowed the nodes."""
    prefilter: Status | None = None
    postfilter: Status | None = None
    """What preemption did (a nominated node) or why it could not."""


class Framework:
    """The plugins of one scheduling profile, grouped per extension point."""

    def __init__(
        self,
        scheduler_name: str,
        plugins: Sequence[EnabledPlugin],
        handle: Handle,
        percentage_of_nodes_to_score: int = 0,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.handle = handle
        self.percentage = percentage_of_nodes_to_score
        self.plugins = [p.plugin for p in plugins]
        for plugin in self.plugins:
            check_plugin(plugin)
        self.pre_filter = [p for p in self.plugins if isinstance(p, PreFilterPlugin)]
        self.filters = [p for p in self.plugins if isinstance(p, FilterPlugin)]
        self.post_filters = [p for p in self.plugins if isinstance(p, PostFilterPlugin)]
        self.scores: list[tuple[ScorePlugin, int, bool]] = [
            (p.plugin, p.weight, isinstance(p.plugin, ScoreExtensions))
            for p in plugins
            if isinstance(p.plugin, ScorePlugin) and p.weight
        ]
        """(plugin, weight, has NormalizeScore); the protocol checks are done once, here"""
        self.reserves = [p for p in self.plugins if isinstance(p, ReservePlugin)]
        self.permits = [p for p in self.plugins if isinstance(p, PermitPlugin)]
        self.pre_binds = [p for p in self.plugins if isinstance(p, PreBindPlugin)]
        self.binds = [p for p in self.plugins if isinstance(p, BindPlugin)]
        self.post_binds = [p for p in self.plugins if isinstance(p, PostBindPlugin)]
        self._next_start = 0

    def events_of(self) -> dict[str, frozenset[str]]:
        """Plugin name -> the ClusterEvents that may undo its rejections."""
        return {
            p.name: p.events_to_register() if isinstance(p, EnqueueExtensions) else ALL_EVENTS
            for p in self.plugins
        }

    def plugin(self, name: str) -> Plugin | None:
        return next((p for p in self.plugins if p.name == name), None)

    # -- scheduling cycle ---------------------------------------------------------------

    def run_pre_filter(
        self, state: CycleState, pod: PodInfo, skip: str = ""
    ) -> tuple[PreFilterResult | None, Status]:
        result: PreFilterResult | None = None
        for p in self.pre_filter:
            if skip and p.name == skip:
                state.skip_filter.add(p.name)
                continue
            r, status = p.pre_filter(state, pod)
            if status.code == Code.SKIP:
                state.skip_filter.add(p.name)
                state.skip_score.add(p.name)
                continue
            if not status.ok:
                return None, status.with_plugin(p.name)
            if r is not None:
                if result is None:
                    result = PreFilterResult(r.node_names, r.excluded_reason, r.enough, (p.name,))
                else:  # intersect, keeping the first plugin's order
                    keep = set(r.node_names)
                    result = PreFilterResult(
                        [n for n in result.node_names if n in keep],
                        result.excluded_reason or r.excluded_reason,
                        result.enough,
                        (*result.plugins, p.name),
                    )
        return result, SUCCESS

    def run_filters(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        skip = state.skip_filter
        for p in self.filters:
            if skip and p.name in skip:
                continue
            status = p.filter(state, pod, node)
            if status is not SUCCESS and not status.ok:
                return status.with_plugin(p.name)
        return SUCCESS

    def run_filters_with_nominated(
        self,
        state: CycleState,
        pod: PodInfo,
        node: NodeInfo,
        nominated: Sequence[PodInfo] = (),
        skip: str = "",
    ) -> Status:
        """`run_filters`, and again with the node's `nominated` pods of priority at least
        the pod's reserved on it (upstream's RunFilterPluginsWithNominatedPods), so that what
        a preemption freed for a pod is not taken by a lower-priority one meanwhile; their
        PreFilter runs without the plugin named `skip`. Caller holds the cache lock."""
        status = self.run_filters(state, pod, node)
        if not status.ok or not nominated:
            return status
        cache = self.handle.cache
        added: list[tuple[CycleState, PodInfo]] = []
        try:
            for other in nominated:
                if other.uid == pod.uid or other.priority < pod.priority or other.uid in cache.pods:
                    continue
                other_state = CycleState()
                _, pre = self.run_pre_filter(other_state, other, skip)
                if not pre.ok:
                    continue
                cache.assume_pod(other, node.name)
                if self.run_reserve(other_state, other, node.name).ok:
                    added.append((other_state, other))
                else:  # its victims still hold what it needs: they hold it against this pod too
                    cache.forget_pod(other.uid)
            if added:
                status = self.run_filters(state, pod, node)
        finally:
            for other_state, other in reversed(added):
                self.run_unreserve(other_state, other, node.name)
                cache.forget_pod(other.uid)
        return status

    def node_status(
        self,
        state: CycleState,
        pod: PodInfo,
        pre: PreFilterResult | None,
        node: NodeInfo,
        nominated: Sequence[PodInfo] = (),
    ) -> Status:
        """The profile's verdict on `node` after PreFilter (`pre`): outside its narrowed set
        (the PreFilter's reason), or Filter with the node's `nominated` pods."""
        if pre is not None and node.name not in pre.node_names:
            return unschedulable(pre.excluded_reason or "node(s) left out by PreFilter")
        ruled_out = state.ruled_out_status(node.name)
        if ruled_out is not None:
            return ruled_out
        return self.run_filters_with_nominated(state, pod, node, nominated)

    def find_feasible(
        self, state: CycleState, pod: PodInfo, prefilter: PreFilterResult | None, all_nodes: int
    ) -> tuple[list[NodeInfo], Diagnosis]:
        """Filters nodes (PreFilter's order when given) until enough feasible ones are found."""
        nodes_map = self.handle.cache.nodes
        diagnosis = Diagnosis({})
        candidates: Iterable[NodeInfo]
        if prefilter is not None:
            names = prefilter.node_names
            diagnosis.excluded = max(0, all_nodes - len(names))
            diagnosis.excluded_reason = prefilter.excluded_reason
            diagnosis.excluded_by = prefilter.plugins
            candidates = (n for n in (nodes_map.get(x) for x in names) if n and n.present)
            total = len(names)
        else:
            present = [n for n in nodes_map.values() if n.present]
            total = len(present)
            if total:
                start = self._next_start % total
                present = present[start:] + present[:start]
            candidates = present
        want = num_feasible_nodes_to_find(self.percentage, total)
        if prefilter is not None and prefilter.enough > 0:
            want = min(want, prefilter.enough)
        feasible: list[NodeInfo] = []
        processed = 0
        nominations = self.handle.nominations()
        ruled_out = state.ruled_out
        for node in candidates:
            processed += 1
            if ruled_out:
                status = state.ruled_out_status(node.name)
                if status is not None:
                    diagnosis.statuses[node.name] = status
                    continue
            if nominations and node.name in nominations:
                status = self.run_filters_with_nominated(state, pod, node, nominations[node.name])
            else:
                status = self.run_filters(state, pod, node)
            if status is SUCCESS or status.ok:
                feasible.append(node)
                if len(feasible) >= want:
                    break
            else:
                diagnosis.statuses[node.name] = status
        if prefilter is None and total:
            self._next_start = (self._next_start + processed) % total
        if not feasible and diagnosis.excluded:
            assert prefilter is not None
            self._explain_excluded(state, pod, prefilter, diagnosis)
        return feasible, diagnosis

    def _explain_excluded(
        self, state: CycleState, pod: PodInfo, prefilter: PreFilterResult, diagnosis: Diagnosis
    ) -> None:
        """A node the PreFilter left out is reported with the reason of a Filter plugin
        that runs before the narrowing plugin's and rejects it for good (node affinity,
        taints, unschedulable), as upstream reports a node's first failing filter; the others
        keep the PreFilter's reason. Run only when no node is feasible."""
        first = next(
            (i for i, p in enumerate(self.filters) if p.name in prefilter.plugins),
            len(self.filters),
        )
        before = [p for p in self.filters[:first] if p.name not in state.skip_filter]
        if not before:
            return
        kept = set(prefilter.node_names)
        for node in self.handle.cache.nodes.values():
            if not node.present or node.name in kept or node.name in diagnosis.statuses:
                continue
            for p in before:
                status = p.filter(state, pod, node)
                if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                    diagnosis.statuses[node.name] = status.with_plugin(p.name)
                    diagnosis.excluded = max(0, diagnosis.excluded - 1)
                    break

    def run_post_filter(
        self, state: CycleState, pod: PodInfo, diagnosis: Diagnosis
    ) -> tuple[str | None, Status]:
        """The first PostFilter plugin that nominates a node, else the last rejection."""
        last = Status(Code.UNSCHEDULABLE)
        for p in self.post_filters:
            nominated, status = p.post_filter(state, pod, diagnosis.statuses)
            if status.ok:
                return nominated, status.with_plugin(p.name)
            last = status.with_plugin(p.name)
        return None, last

    def run_score(self, state: CycleState, pod: PodInfo, nodes: list[NodeInfo]) -> dict[str, int]:
        totals = dict.fromkeys((n.name for n in nodes), 0)
        skip = state.skip_score
        for p, weight, normalizes in self.scores:
            if skip and p.name in skip:
                continue
            score = p.score
            scores = {n.name: score(state, pod, n) for n in nodes}
            if normalizes:
                cast(ScoreExtensions, p).normalize_score(state, pod, scores)
            for name, s in scores.items():
                totals[name] += s * weight
        return totals

    def select_host(self, nodes: list[NodeInfo], state: CycleState, pod: PodInfo) -> str:
        """The feasible node with the best weighted score (first in try order on ties)."""
        if len(nodes) == 1 or not self.scores:
            return nodes[0].name
        totals = self.run_score(state, pod, nodes)
        best, best_score = nodes[0].name, totals[nodes[0].name]
        for n in nodes[1:]:
            s = totals[n.name]
            if s > best_score:
                best, best_score = n.name, s
        return best

    def run_reserve(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        for i, p in enumerate(self.reserves):
            try:
                status = p.reserve(state, pod, node_name)
            except Exception as exc:
                log.exception("reserve plugin failed", extra={"pod": pod.key, "plugin": p.name})
                status = error(f"plugin {p.name} failed at Reserve: {exc}")
            if not status.ok:
                for q in reversed(self.reserves[: i + 1]):
                    q.unreserve(state, pod, node_name)
                return status.with_plugin(p.name)
        return SUCCESS

    def run_unreserve(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        for p in reversed(self.reserves):
            try:
                p.unreserve(state, pod, node_name)
            except Exception:
                log.exception("unreserve plugin failed", extra={"pod": pod.key, "plugin": p.name})

    def run_permit(
        self, state: CycleState, pod: PodInfo, node_name: str
    ) -> tuple[Status, dict[str, float]]:
        """SUCCESS, a rejection, or WAIT with the plugins that asked to wait and their timeouts."""
        waits: dict[str, float] = {}
        for p in self.permits:
            status, timeout = p.permit(state, pod, node_name)
            if status.code == Code.WAIT:
                waits[p.name] = timeout
            elif status.rejected or status.code == Code.ERROR:
                return status.with_plugin(p.name), {}
        if waits:
            return Status(Code.WAIT), waits
        return SUCCESS, {}

    # -- binding cycle --------------------------------------------------------------------

    def run_pre_bind(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        for p in self.pre_binds:
            status = p.pre_bind(state, pod, node_name)
            if not status.ok:
                return status.with_plugin(p.name)
        return SUCCESS

    def run_bind(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        for p in self.binds:
            status = p.bind(state, pod, node_name)
            if status.code != SKIP.code:
                return status.with_plugin(p.name)
        return error("no bind plugin bound the pod")

    def run_post_bind(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        for p in self.post_binds:
            p.post_bind(state, pod, node_name)


__all__ = ["Diagnosis", "EnabledPlugin", "Framework", "num_feasible_nodes_to_find"]
