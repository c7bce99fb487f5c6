"""Refusals: the pods whose calls the plugin refused, and the refusals of a call that cannot
be tied to exactly one pod."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from lj_runtimekit.deviceplugin.internal.allocate.resolve import Waiting
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import PodInfo


class RefusedPods:
    """Pods a call was refused for: the kubelet rejects such a pod at once, though its pod
    list still shows it Pending for a moment (oldest first, bounded)."""

    def __init__(self, limit: int = 10000) -> None:
        self._uids: dict[str, None] = {}
        self._limit = limit

    def add(self, pod: PodInfo) -> None:
        """Remember that a call for `pod` failed: the kubelet has rejected it."""
        self._uids[pod.uid] = None
        while len(self._uids) > self._limit:
            self._uids.pop(next(iter(self._uids)))

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


def one_pod(waiting: Sequence[Waiting], node: str, resource: str, count: int, seen: str) -> Waiting:
    """The only waiting pod; AllocationError when there are several or none (`seen`: the
    lists the plugin read, for the message)."""
    if len(waiting) > 1:
        refs = sorted(w.pod.ref for w in waiting)
        names = ", ".join(refs[:5]) + (f" and {len(refs) - 5} more" if len(refs) > 5 else "")
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"cannot tell which pod the kubelet is admitting on node {node}:"
            f" {len(refs)} pods wait for devices ({names}) in {seen}; only one can be in"
            " admission at a time (docs/protocol.md), so either the kubelet rejected one of"
            " them before its device calls and its Failed status has not reached these lists"
            " yet, or one was bound around the Runtime Kit scheduler (spec.nodeName set at"
            " creation, or another scheduler); refusing rather than guessing",
        )
    if not waiting:
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"no pod on node {node} waits for devices in {seen}, yet the kubelet asks for"
            f" {count} of {resource}; was the pod deleted, or its resource limits changed?",
        )
    return waiting[0]
