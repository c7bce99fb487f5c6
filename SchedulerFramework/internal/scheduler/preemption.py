"""Preemption's bookkeeping and API writes: nominated pods, victims' eviction.

The DefaultPreemption plugin chooses a node and victims; the scheduler then
records the pod as nominated to the node (its `status.nominatedNodeName`, as
kube-scheduler writes it), so that lower-priority pods do not take what the
victims free (Framework.run_filters_with_nominated), and evicts the victims
from a thread of its own (one preemption at a time, its victims in
parallel): the condition `DisruptionTarget` (reason `PreemptionByScheduler`),
the deletion (preconditioned on the victim's uid), an event `Preempted` on
each victim.

A gang member is nominated (its node and victims tracked) but not counted on
the node for other pods' filters: Coscheduling's claim on the gang's planned
nodes holds its room (running a member's PreFilter and Reserve for another
pod's filter would change its gang's plan).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lj_runtimekit.proto.pkg.kube import STRATEGIC_MERGE_PATCH, KubeClient, KubeError, api_time
from lj_runtimekit.schedulerframework.internal.cache.cache import Cache
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling.plugin import gang_key
from lj_runtimekit.schedulerframework.internal.scheduler.worker import Worker

log = logging.getLogger(__name__)

DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
EVICT_WORKERS = 16
"""Victims of one preemption evicted at once (upstream's parallelism)."""


def nominated_node(pod: PodInfo) -> str:
    """The pod's `status.nominatedNodeName` ("" when none)."""
    return str((pod.obj.get("status") or {}).get("nominatedNodeName") or "")


def terminating_by_preemption(pod: PodInfo) -> bool:
    """Being deleted, with the condition a scheduler's preemption writes (upstream's
    podTerminatingByPreemption)."""
    if not pod.deleting:
        return False
    for c in (pod.obj.get("status") or {}).get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == DISRUPTION_TARGET:
            return c.get("status") == "True" and c.get("reason") == PREEMPTION_BY_SCHEDULER
    return False


class Nominator:
    """Pending pods nominated to nodes, and the victims each still waits for.

    Changed and read under the cache lock (the scheduling cycle holds it)."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache
        self.by_node: dict[str, list[PodInfo]] = {}
        self._node_of: dict[str, str] = {}
        self._victims: dict[str, frozenset[str]] = {}
        self._preemptor_of: dict[str, str] = {}
        """victim uid -> the uid of the pod it makes room for"""

    def add(self, pod: PodInfo, node: str, victims: Sequence[str] = ()) -> None:
        with self._cache.lock:
            self.remove(pod.uid)
            if gang_key(pod, self._cache.protocol.annotations.gang_group) is None:
                self.by_node.setdefault(node, []).append(pod)
            self._node_of[pod.uid] = node
            if victims:
                self._victims[pod.uid] = frozenset(victims)
                self._preemptor_of.update(dict.fromkeys(victims, pod.uid))

    def update(self, pod: PodInfo) -> None:
        """A pending pod seen by the watch: kept nominated (the newer object), or nominated
        from its status (a restart)."""
        with self._cache.lock:
            node = self._node_of.get(pod.uid)
            if node is None:
                node = nominated_node(pod)
                if node:
                    self.add(pod, node)
                return
            pods = self.by_node.get(node, [])
            pods[:] = [pod if p.uid == pod.uid else p for p in pods]

    def remove(self, uid: str) -> None:
        with self._cache.lock:
            node = self._node_of.pop(uid, None)
            self.drop_victims(uid)
            if node is None:
                return
            left = [p for p in self.by_node.get(node, ()) if p.uid != uid]
            if left:
                self.by_node[node] = left
            else:
                self.by_node.pop(node, None)

    def victim_gone(self, uid: str) -> str | None:
        """Pod `uid` left the cache: the pod it was a victim for, once all its victims have."""
        with self._cache.lock:
            preemptor = self._preemptor_of.pop(uid, None)
            if preemptor is None or self.pending(preemptor) is not None:
                return None
            return preemptor if preemptor in self._node_of else None

    def drop_victims(self, uid: str) -> None:
        """An eviction failed: the pod may preempt again."""
        with self._cache.lock:
            for victim in self._victims.pop(uid, ()):
                self._preemptor_of.pop(victim, None)

    def waiting(self, pod: PodInfo) -> str | None:
        """The pod's nominated node while its preemption waits for victims to go: a victim
        it chose is still accounted, or (as upstream, and what a restarted scheduler sees)
        a lower-priority pod there is terminating by preemption."""
        with self._cache.lock:
            pending = self.pending(pod.uid)
            if pending is not None:
                return pending
            node = self._node_of.get(pod.uid)
            info = self._cache.nodes.get(node) if node else None
            if info is None:
                return None
            for uid in info.pods:
                st = self._cache.pods.get(uid)
                if st and st.pod.priority < pod.priority and terminating_by_preemption(st.pod):
                    return node
            return None

    def pending(self, uid: str) -> str | None:
        """The nominated node while a victim of the pod's preemption is still accounted, or
        still holds the ResourceClaims made for it (the claim controller deallocates them
        once it is gone: until then a second preemption would take another victim)."""
        with self._cache.lock:
            victims = self._victims.get(uid)
            if victims is None:
                return None
            dra = self._cache.dra
            if any(v in self._cache.pods or dra.holds_claims_of(v) for v in victims):
                return self._node_of.get(uid)
            del self._victims[uid]
            return None


@dataclass(frozen=True)
class Preemption:
    pod: PodInfo
    node: str
    victims: tuple[PodInfo, ...]


class Evictor:
    """Writes preemptions to the API server on one thread (the scheduling loop never waits)."""

    def __init__(
        self,
        kube: KubeClient | None,
        event: Callable[[PodInfo, str, str, str], None],
        failed: Callable[[str], None],
    ) -> None:
        self.kube = kube
        self._event = event
        self._failed = failed
        self.done: list[Preemption] = []
        """Without an API client (unit tests): the preemptions asked for."""
        self._worker = (
            Worker("preemption", self._write, self._not_written) if kube is not None else None
        )

    def submit(self, p: Preemption) -> None:
        for v in p.victims:
            self._event(
                v,
                "Normal",
                "Preempted",
                f"Preempted by pod {p.pod.key} ({p.pod.uid}) on node {p.node}",
            )
        if self._worker is None:
            self.done.append(p)
            return
        self._worker.put(p)

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()

    def _not_written(self, p: Preemption, exc: Exception) -> None:
        if isinstance(exc, KubeError):
            log.warning("preemption not written: %s", exc, extra={"pod": p.pod.key})
        else:
            log.error("preemption not written", exc_info=exc, extra={"pod": p.pod.key})
        self._failed(p.pod.uid)

    def _patch_status(self, pod: PodInfo, status: Mapping[str, object]) -> None:
        assert self.kube is not None
        try:
            self.kube.request(
                "PATCH",
                f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
                body={"status": status},
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    def _write(self, p: Preemption) -> None:
        self._patch_status(p.pod, {"nominatedNodeName": p.node})
        with ThreadPoolExecutor(min(len(p.victims), EVICT_WORKERS) or 1) as pool:
            list(pool.map(lambda v: self._evict(p, v), p.victims))

    def _evict(self, p: Preemption, v: PodInfo) -> None:
        assert self.kube is not None
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": PREEMPTION_BY_SCHEDULER,
            "message": f"{p.pod.scheduler_name}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": api_time(),
        }
        self._patch_status(v, {"conditions": [condition]})
        try:
            self.kube.request(
                "DELETE",
                f"/api/v1/namespaces/{v.namespace}/pods/{v.name}",
                body={"preconditions": {"uid": v.uid}},
            )
        except KubeError as exc:
            if exc.status not in (404, 409):  # gone already (409: another pod by that name)
                raise
        log.info("preempted pod", extra={"pod": v.key, "node": p.node, "preemptor": p.pod.key})
