"""NodeUnschedulable: a cordoned node takes no new pod unless the pod tolerates it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    EnqueueExtensions,
    FilterPlugin,
    Handle,
    QueueingHintPlugin,
    passes_now,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    ClusterEvent,
    CycleState,
    Status,
    unresolvable,
)

NAME = "NodeUnschedulable"
TAINT_KEY = "node.kubernetes.io/unschedulable"
REASON = "node(s) were unschedulable"


@dataclass(frozen=True)
class Args:
    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ())
        return Args()


class NodeUnschedulable(FilterPlugin, EnqueueExtensions, QueueingHintPlugin):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args

    def events_to_register(self) -> frozenset[str]:
        return frozenset({ClusterEvent.NODE_ADD, ClusterEvent.NODE_TAINT})

    def queueing_hint(self, pod: PodInfo, old: NodeInfo | None, new: NodeInfo) -> bool:
        return passes_now(self, pod, old, new)

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        if not node.unschedulable:
            return SUCCESS
        if any(t.tolerates(TAINT_KEY, "", "NoSchedule") for t in pod.tolerations):
            return SUCCESS
        return unresolvable(REASON)


def new(args: Args, handle: Handle) -> NodeUnschedulable:
    return NodeUnschedulable(args, handle)
