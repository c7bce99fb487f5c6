"""DynamicResources: keeps this scheduler out of Dynamic Resource Allocation (resource.k8s.io).

This scheduler does not allocate ResourceClaims. A pod with `spec.resourceClaims` it bound
would be refused by the kubelet or run with its claim unallocated, so PreFilter turns it
away for good, saying to leave it to the default scheduler (in extender mode the
kube-scheduler allocates them: `CLAIMS_ALLOCATED_ELSEWHERE`). A node labelled
`labels.device_api` = `dra` serves its devices through DRA, not the Device Plugin: the
cache gives it no device (NodeInfo.dra, whatever inventory annotation it still carries),
and Filter turns device pods away from it saying so. Both checks are O(1) per pod and node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.proto.pkg.protocol import DRA_MODE
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.args import check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    EnqueueExtensions,
    FilterPlugin,
    Handle,
    PreFilterPlugin,
    QueueingHintPlugin,
    passes_now,
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
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import device_request
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import RequestError

NAME = "DynamicResources"
CLAIMS_ALLOCATED_ELSEWHERE = "DynamicResources/claims-allocated-elsewhere"
"""CycleState key a caller sets when the kube-scheduler allocates the pod's claims (extender
mode): PreFilter then lets a pod with claims through."""


def claim_names(pod: PodInfo) -> list[str]:
    """The names of the pod's `spec.resourceClaims` entries (empty: it uses no claim)."""
    claims = (pod.obj.get("spec") or {}).get("resourceClaims") or ()
    return [str(c.get("name", "")) if isinstance(c, dict) else str(c) for c in claims]


@dataclass(frozen=True)
class Args:
    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ())
        return Args()


class DynamicResources(PreFilterPlugin, FilterPlugin, EnqueueExtensions, QueueingHintPlugin):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args
        self.handle = handle
        label = handle.protocol.labels.device_api
        self.node_reason = (
            f"node(s) serve devices through DRA (label {label}={DRA_MODE}): device pods there "
            "need ResourceClaims and the default scheduler"
        )

    def events_to_register(self) -> frozenset[str]:
        return frozenset({ClusterEvent.NODE_ADD, ClusterEvent.NODE_LABEL})

    def queueing_hint(self, pod: PodInfo, old: NodeInfo | None, new: NodeInfo) -> bool:
        # a pod's claims never go (spec.resourceClaims is immutable): no node helps it
        return not claim_names(pod) and passes_now(self, pod, old, new)

    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        names = claim_names(pod)
        if names and state.read(CLAIMS_ALLOCATED_ELSEWHERE) is None:
            return None, unresolvable(
                f"pod has spec.resourceClaims ({', '.join(names)}) and scheduler "
                f"{pod.scheduler_name} does not allocate ResourceClaims: set "
                "spec.schedulerName to default-scheduler (or leave it unset) so that "
                "kube-scheduler allocates them"
            )
        try:
            asks_devices = device_request(pod, self.handle) is not None
        except RequestError:
            asks_devices = True  # GpuShare's PreFilter says what is wrong with it
        return None, SUCCESS if asks_devices else SKIP

    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        return unresolvable(self.node_reason) if node.dra else SUCCESS


def new(args: Args, handle: Handle) -> DynamicResources:
    return DynamicResources(args, handle)
