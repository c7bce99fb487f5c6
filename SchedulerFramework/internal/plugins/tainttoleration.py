"""TaintToleration: NoSchedule / NoExecute taints the pod does not tolerate rule a node out;
PreferNoSchedule ones it does not tolerate lower the node's score."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo, Taint
from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    PodInfo,
    Toleration,
)
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    EnqueueExtensions,
    FilterPlugin,
    Handle,
    PreFilterPlugin,
    QueueingHintPlugin,
    ScoreExtensions,
    ScorePlugin,
    passes_now,
    scale_to_max,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    ClusterEvent,
    CycleState,
    PreFilterResult,
    Status,
    unresolvable,
)

NAME = "TaintToleration"


@dataclass(frozen=True)
class Args:
    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ())
        return Args()


def untolerated(taints: Iterable[Taint], tolerations: Sequence[Toleration]) -> Iterator[Taint]:
    """The taints no toleration tolerates (a toleration's effect must match, or be empty)."""
    for taint in taints:
        if not any(t.tolerates(taint.key, taint.value, taint.effect) for t in tolerations):
            yield taint


class TaintToleration(
    PreFilterPlugin,
    FilterPlugin,
    ScorePlugin,
    ScoreExtensions,
    EnqueueExtensions,
    QueueingHintPlugin,
):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args
        self.handle = handle

    def events_to_register(self) -> frozenset[str]:
        return frozenset({ClusterEvent.NODE_ADD, ClusterEvent.NODE_TAINT})

    def queueing_hint(self, pod: PodInfo, old: NodeInfo | None, new: NodeInfo) -> bool:
        return passes_now(self, pod, old, new)

    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        cache = self.handle.cache
        if not cache.soft_tainted:
            state.skip_score.add(NAME)  # no PreferNoSchedule taint anywhere: nothing to score
        # Nodes sharing their taints are judged once: the search skips a whole rejected group
        # (say a zone's unreachable nodes, still in the free-device index) without filtering
        # each node of it.
        for taints, names in cache.hard_tainted.items():
            status = self._judge(taints, pod)
            if not status.ok:
                state.ruled_out.append((names, status.with_plugin(NAME)))
        return None, SUCCESS

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        return self._judge(node.taints, pod) if node.taints else SUCCESS

    @staticmethod
    def _judge(taints: tuple[Taint, ...], pod: PodInfo) -> Status:
        taint = next(untolerated(taints, pod.tolerations), None)
        if taint is None:
            return SUCCESS
        shown = f"{taint.key}: {taint.value}" if taint.value else taint.key
        return unresolvable(f"node(s) had untolerated taint {{{shown}}}")

    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        """How many PreferNoSchedule taints the pod does not tolerate (fewer is better)."""
        return sum(1 for _ in untolerated(node.soft_taints, pod.tolerations))

    def normalize_score(self, state: CycleState, pod: PodInfo, scores: dict[str, int]) -> None:
        scale_to_max(scores, reverse=True)


def new(args: Args, handle: Handle) -> TaintToleration:
    return TaintToleration(args, handle)
