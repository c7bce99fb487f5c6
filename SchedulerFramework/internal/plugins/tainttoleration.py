"""TaintToleration: NoSchedule / NoExecute taints the pod does not tolerate rule a node out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import Handle
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    CycleState,
    PodInfo,
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


class TaintToleration:
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        for taint in node.taints:
            if not any(t.tolerates(taint.key, taint.value, taint.effect) for t in pod.tolerations):
                shown = f"{taint.key}: {taint.value}" if taint.value else taint.key
                return unresolvable(f"node(s) had untolerated taint {{{shown}}}")
        return SUCCESS


def new(args: Args, handle: Handle) -> TaintToleration:
    return TaintToleration(args, handle)
