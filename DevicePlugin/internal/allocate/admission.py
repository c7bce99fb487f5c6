"""The pods waiting for devices as the plugin sees them: the kubelet's list, the API server's
when that one is ambiguous, and the kubelet's active pods (PodResources) when the list is the
API server's (docs/protocol.md, "Identity")."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import grpc

from lj_runtimekit.deviceplugin.internal.allocate.collect import Collector
from lj_runtimekit.deviceplugin.internal.allocate.crosscheck import CrossCheck
from lj_runtimekit.deviceplugin.internal.allocate.ledger import Ledger
from lj_runtimekit.deviceplugin.internal.allocate.refusals import RefusedPods
from lj_runtimekit.deviceplugin.internal.allocate.resolve import DoneKey, Waiting, waiting_pods
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import NodePods, PodInfo, PodLookupError
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager
from lj_runtimekit.proto.pkg.protocol import BIND_PHASE_ALLOCATED, Protocol

log = logging.getLogger(__name__)


class Admission:
    """Finds the pods waiting for devices, releasing what finished pods hold on the way."""

    def __init__(
        self,
        pods: NodePods,
        rm: ResourceManager,
        protocol: Protocol,
        ledger: Ledger,
        refused: RefusedPods,
        collector: Collector,
        crosscheck: CrossCheck,
        *,
        require_uid: bool = False,
    ) -> None:
        self._pods = pods
        self._rm = rm
        self._protocol = protocol
        self._ledger = ledger
        self._refused = refused
        self._collector = collector
        self._crosscheck = crosscheck
        self._require_uid = require_uid

    def waiting(self, pods: Sequence[PodInfo], done: set[DoneKey]) -> list[Waiting]:
        """The pods of `pods` waiting for devices, those refused before left out."""
        served = self._rm.resources()
        ann = self._protocol.annotations
        listed = [p for p in pods if p.uid not in self._refused]
        return waiting_pods(
            listed,
            served.__contains__,
            done,
            ann.assigned_devices,
            ann.bind_phase,
            require_uid=self._require_uid,
        )

    async def pods(self) -> list[PodInfo]:
        """The node's pods; AllocationError (UNAVAILABLE) when no source answers."""
        try:
            return await self._pods.list_pods()
        except PodLookupError as exc:
            raise AllocationError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc

    async def fresh(self) -> list[PodInfo] | None:
        """The API server's list read now; None without access or when it fails."""
        try:
            return await self._pods.fresh()
        except PodLookupError as exc:
            log.warning("API server pod list failed", extra={"reason": str(exc)})
            return None

    async def admitting(self) -> Admitting:
        """The pods waiting for devices (one when the protocol holds), the pod list, and the
        lists that decided.

        The pod list is the kubelet's when it answers; where it shows no or several
        waiting pods, or a pod holding devices has left it, the API server's list
        (read now) decides: a pod the kubelet rejected is Failed there once its status
        has gone round. Where several still wait, or the list is the API server's, the
        kubelet's active pods (PodResources) decide: they hold the pod it admits, and
        neither a pod it rejected nor one it has yet to reach.
        """
        pods = await self.pods()
        source = "kubelet's" if self._pods.from_kubelet else "API server's"
        seen = [f"the {source} pod list"]
        await self._collector.release_finished(pods, fresh=False)
        done = self._ledger.done()
        waiting = self.waiting(pods, done)
        if len(waiting) != 1 or self._ledger.missing():
            fresh = await self.fresh()
            if fresh is not None:
                await self._collector.release_finished(fresh, fresh=True)
                done = self._ledger.done()
                fresh_waiting = self.waiting(fresh, done)
                listed = {p.uid for p in pods}
                # The API server may already hold a pod the kubelet has not reached: only
                # pods the kubelet lists can be the one it is admitting.
                waiting = [w for w in fresh_waiting if w.pod.uid in listed] or fresh_waiting
                pods = fresh
                if self._pods.from_kubelet:
                    seen.append("the API server's pod list read now")
        if len(waiting) > 1 or not self._pods.from_kubelet:
            # The API server lists every pod bound to the node at once, and forgets a pod
            # deleted while the kubelet may still be admitting it; a pod the kubelet
            # rejected stays Pending in both lists until its status has gone round.
            active = await self._crosscheck.kubelet_active()
            if active is not None:
                waiting = [w for w in waiting if (w.pod.namespace, w.pod.name) in active]
                seen.append("the kubelet's active pods (PodResources)")
        namesake = None
        if len(waiting) == 1 and not self._pods.from_kubelet:
            namesake = self._namesake(waiting[0].pod)
        return Admitting(waiting, pods, ", ".join(seen), namesake)

    def _namesake(self, pod: PodInfo) -> PodInfo | None:
        """A pod of the same namespace and name, another UID, that the API server deleted
        while Pending and not yet allocated: the kubelet may still be admitting it, and its
        active pods (PodResources) name pods without their UIDs."""
        phase_key = self._protocol.annotations.bind_phase
        for gone in self._pods.deleted_pending():
            if (
                (gone.namespace, gone.name) == (pod.namespace, pod.name)
                and gone.uid != pod.uid
                and gone.annotations.get(phase_key) != BIND_PHASE_ALLOCATED
            ):
                return gone
        return None

    def refuse_namesake(self, pod: PodInfo, gone: PodInfo, node: str) -> AllocationError:
        """The refusal of one call that may be `gone`'s rather than `pod`'s; `gone` is not
        reported again: whichever pod the call was for, the kubelet rejects it and is past
        `gone` (it takes a pod's removal before a later pod of the same name)."""
        self._pods.forget_deleted(gone.uid)
        return AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"cannot tell whether the kubelet on node {node} is admitting pod {pod.ref}"
            f" (UID {pod.uid}) or the pod of the same name the API server deleted before it"
            f" got its devices (UID {gone.uid}): the kubelet's active pods (PodResources)"
            " carry names, not UIDs; refusing this one call rather than guessing (if it was"
            f" {pod.ref}'s, the kubelet fails it and its controller creates it again)",
        )


class Admitting(NamedTuple):
    """What `Admission.admitting` found."""

    waiting: list[Waiting]
    pods: list[PodInfo]
    seen: str
    """The lists that decided, for messages."""
    namesake: PodInfo | None = None
    """A deleted pod of the only waiting pod's name the kubelet may still admit
    (`Admission.refuse_namesake`)."""
