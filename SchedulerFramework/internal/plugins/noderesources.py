"""NodeResourcesFit: cpu, memory, pods and extended resources fit (init-container rule).

The pod's effective request is computed once when it is parsed (`parse_pod`):
the Kubernetes peak rule (`peak_use`, the same one the GpuShare plugin counts
devices by): the largest of each init container plus the sidecars declared
before it, and all sidecars plus all app containers; + overhead. Score:
LeastAllocated (spread load) or MostAllocated (pack) over cpu and memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    CPU,
    MEMORY,
    PODS,
    PodInfo,
)
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields, choice
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    MAX_NODE_SCORE,
    EnqueueExtensions,
    FilterPlugin,
    Handle,
    ScorePlugin,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    ClusterEvent,
    CycleState,
    Status,
    unschedulable,
)

NAME = "NodeResourcesFit"
STRATEGIES = ("LeastAllocated", "MostAllocated")


@dataclass(frozen=True)
class Args:
    scoring_strategy: str = "LeastAllocated"

    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ("scoringStrategy",))
        return Args(choice(NAME, raw, "scoringStrategy", STRATEGIES, "LeastAllocated"))


class NodeResourcesFit(FilterPlugin, ScorePlugin, EnqueueExtensions):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.most = args.scoring_strategy == "MostAllocated"

    def events_to_register(self) -> frozenset[str]:
        return frozenset(
            {ClusterEvent.NODE_ADD, ClusterEvent.NODE_ALLOCATABLE, ClusterEvent.POD_DELETE}
        )

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        alloc = node.allocatable
        used = node.requested
        reasons: list[str] = []
        for name, want in pod.requests.items():
            if want <= 0:
                continue
            if name == PODS:
                if len(node.pods) + 1 > alloc.get(PODS, 0):
                    reasons.append("Too many pods")
                continue
            if alloc.get(name, 0) - used.get(name, 0) < want:
                reasons.append(f"Insufficient {name}")
        return unschedulable(*sorted(reasons)) if reasons else SUCCESS

    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        total = 0
        for name in (CPU, MEMORY):
            cap = node.allocatable.get(name, 0)
            if cap <= 0:
                continue
            used = node.requested.get(name, 0) + pod.requests.get(name, 0)
            frac = min(used, cap) * MAX_NODE_SCORE // cap
            total += frac if self.most else MAX_NODE_SCORE - frac
        return total // 2


def new(args: Args, handle: Handle) -> NodeResourcesFit:
    return NodeResourcesFit(args, handle)
