"""NodeAffinity: spec.nodeSelector and required node affinity (matchExpressions, matchFields)
filter nodes; preferred node affinity scores them (sum of the matching terms' weights)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    PodInfo,
    Requirement,
    SelectorTerm,
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
    SKIP,
    SUCCESS,
    ClusterEvent,
    CycleState,
    PreFilterResult,
    Status,
    unresolvable,
)

NAME = "NodeAffinity"
REASON = "node(s) didn't match Pod's node affinity/selector"


@dataclass(frozen=True)
class Args:
    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ())
        return Args()


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def requirement_matches(req: Requirement, value: str | None) -> bool:
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        have, bound = _int(value), _int(req.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def term_matches(term: SelectorTerm, node: NodeInfo) -> bool:
    if not term.expressions and not term.fields:
        return False  # an empty term matches no node
    labels = node.labels
    for req in term.expressions:
        if not requirement_matches(req, labels.get(req.key)):
            return False
    for req in term.fields:
        value = node.name if req.key == "metadata.name" else None
        if not requirement_matches(req, value):
            return False
    return True


def pod_matches_node(pod: PodInfo, node: NodeInfo) -> bool:
    labels = node.labels
    for key, value in pod.node_selector.items():
        if labels.get(key) != value:
            return False
    terms = pod.required_affinity
    return terms is None or any(term_matches(t, node) for t in terms)


class NodeAffinity(
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

    def events_to_register(self) -> frozenset[str]:
        return frozenset({ClusterEvent.NODE_ADD, ClusterEvent.NODE_LABEL})

    def queueing_hint(self, pod: PodInfo, old: NodeInfo | None, new: NodeInfo) -> bool:
        return passes_now(self, pod, old, new)

    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        required = bool(pod.node_selector) or pod.required_affinity is not None
        if not required and not pod.preferred_affinity:
            return None, SKIP
        if not pod.preferred_affinity:
            state.skip_score.add(NAME)
        if not required:
            state.skip_filter.add(NAME)
            return None, SUCCESS
        # A single metadata.name In [...] term narrows the search like upstream does.
        terms = pod.required_affinity or ()
        if len(terms) == 1 and not terms[0].expressions:
            names = [
                v
                for r in terms[0].fields
                if r.key == "metadata.name" and r.operator == "In"
                for v in r.values
            ]
            if names:
                return PreFilterResult(names, REASON), SUCCESS
        return None, SUCCESS

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        return SUCCESS if pod_matches_node(pod, node) else unresolvable(REASON)

    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        return sum(weight for weight, term in pod.preferred_affinity if term_matches(term, node))

    def normalize_score(self, state: CycleState, pod: PodInfo, scores: dict[str, int]) -> None:
        scale_to_max(scores, reverse=False)


def new(args: Args, handle: Handle) -> NodeAffinity:
    return NodeAffinity(args, handle)
