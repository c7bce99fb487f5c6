"""DefaultBinder: one write per pod, a Binding carrying the placement annotations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    BindPlugin,
    Handle,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    CycleState,
    Status,
)

NAME = "DefaultBinder"


@dataclass(frozen=True)
class Args:
    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ())
        return Args()


class DefaultBinder(BindPlugin):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.handle = handle

    def bind(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        return self.handle.bind_pod(pod, node_name, state.binding_annotations)


def new(args: Args, handle: Handle) -> DefaultBinder:
    return DefaultBinder(args, handle)
