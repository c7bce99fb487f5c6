"""The scheduling queue: activeQ (priority, then age), backoffQ, unschedulable pods.

Like upstream's PriorityQueue: a pod that failed goes to the unschedulable
set, or to backoff when a cluster event that might help arrived while it was
being scheduled; cluster events move unschedulable pods back (through
backoff); pods left unschedulable for `max_unschedulable_s` are retried anyway.

Requeue hints (upstream's QueueingHint, by event kind): a failed pod keeps the
names of the plugins that rejected it; a cluster event moves only the pods
one of whose rejecting plugins registered that event (`events_of`); a pod
rejected by no named plugin moves on every event.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo


@dataclass
class QueuedPod:
    pod: PodInfo
    attempts: int = 0
    added: float = field(default_factory=time.monotonic)
    """When it entered the queue (the FIFO tie-breaker)."""
    backoff_until: float = 0.0
    unschedulable_since: float = 0.0
    cycle: int = 0
    """The scheduling cycle in which it was last popped."""
    rejected_by: frozenset[str] = frozenset()
    """The plugins that rejected it in its last attempt (empty: unknown)."""


class SchedulingQueue:
    def __init__(
        self,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        max_unschedulable_s: float = 300.0,
    ) -> None:
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_unschedulable_s = max_unschedulable_s
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._active: list[tuple[int, float, int, str]] = []
        self._backoff: list[tuple[float, int, str]] = []
        self._unschedulable: dict[str, QueuedPod] = {}
        self._pods: dict[str, QueuedPod] = {}
        """every pod the queue knows (active, backoff, unschedulable or in flight)"""
        self._where: dict[str, str] = {}
        self._in_flight: set[str] = set()
        self._activate_in_flight: set[str] = set()
        self._moved_in_flight: set[str] = set()
        """in flight when a change that may let them fit came: to backoff if they fail"""
        self.scheduling_cycle = 0
        self._move_request_cycle = -1
        self._event_cycle: dict[str, int] = {}
        """cluster event -> the scheduling cycle in which it last came"""
        self._closed = False
        self.events_of: dict[str, frozenset[str]] = {}
        """Plugin name -> the cluster events that may undo its rejection (unknown: all)."""

    # -- internals (lock held) --------------------------------------------------------------

    def _push_active(self, qp: QueuedPod) -> None:
        heapq.heappush(self._active, (-qp.pod.priority, qp.added, next(self._seq), qp.pod.uid))
        self._where[qp.pod.uid] = "active"
        self._cond.notify()

    def _push_backoff(self, qp: QueuedPod) -> None:
        heapq.heappush(self._backoff, (qp.backoff_until, next(self._seq), qp.pod.uid))
        self._where[qp.pod.uid] = "backoff"
        self._cond.notify()

    def _backoff_duration(self, attempts: int) -> float:
        d = self.initial_backoff_s * float(2 ** max(0, attempts - 1))
        return min(d, self.max_backoff_s)

    def _flush(self, now: float) -> None:
        while self._backoff and self._backoff[0][0] <= now:
            _, _, uid = heapq.heappop(self._backoff)
            qp = self._pods.get(uid)
            if qp is not None and self._where.get(uid) == "backoff":
                self._push_active(qp)
        stale = [
            uid
            for uid, qp in self._unschedulable.items()
            if now - qp.unschedulable_since >= self.max_unschedulable_s
        ]
        for uid in stale:
            self._move(self._unschedulable.pop(uid), now)

    def _move(self, qp: QueuedPod, now: float) -> None:
        if qp.backoff_until > now:
            self._push_backoff(qp)
        else:
            self._push_active(qp)

    # -- API ----------------------------------------------------------------------------------

    def add(self, pod: PodInfo) -> None:
        """A new pending pod, or an update of a known one."""
        with self._cond:
            uid = pod.uid
            qp = self._pods.get(uid)
            if qp is None:
                qp = self._pods[uid] = QueuedPod(pod)
                self._push_active(qp)
                return
            changed = (
                qp.pod.obj.get("spec") != pod.obj.get("spec")
                or qp.pod.annotations != pod.annotations
                or qp.pod.labels != pod.labels
                # the controller manager named the claims made from its templates
                or qp.pod.claims_made != pod.claims_made
            )
            qp.pod = pod
            if changed and self._where.get(uid) == "unschedulable":
                del self._unschedulable[uid]
                qp.backoff_until = 0.0  # the pod itself changed: try again now
                self._push_active(qp)

    def delete(self, uid: str) -> None:
        with self._cond:
            self._pods.pop(uid, None)
            self._unschedulable.pop(uid, None)
            self._where.pop(uid, None)
            self._activate_in_flight.discard(uid)
            self._moved_in_flight.discard(uid)

    def pop(self, timeout_s: float | None = None) -> QueuedPod | None:
        """The next pod to schedule (None on timeout or close)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                now = time.monotonic()
                self._flush(now)
                while self._active:
                    _, _, _, uid = heapq.heappop(self._active)
                    qp = self._pods.get(uid)
                    if qp is None or self._where.get(uid) != "active":
                        continue
                    self._where[uid] = "in_flight"
                    self._in_flight.add(uid)
                    self.scheduling_cycle += 1
                    qp.cycle = self.scheduling_cycle
                    qp.attempts += 1
                    return qp
                if self._closed:
                    return None
                wait = 1.0
                if self._backoff:
                    wait = min(wait, max(0.0, self._backoff[0][0] - now))
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                self._cond.wait(wait)

    def done(self, uid: str) -> None:
        """The pod's scheduling attempt finished (bound, or handed back)."""
        with self._cond:
            self._in_flight.discard(uid)
            self._activate_in_flight.discard(uid)
            self._moved_in_flight.discard(uid)
            if self._where.get(uid) == "in_flight":
                self._where.pop(uid, None)
                self._pods.pop(uid, None)

    def add_unschedulable(self, qp: QueuedPod, backoff: bool = True) -> None:
        """Hand a pod back after a failed attempt."""
        with self._cond:
            uid = qp.pod.uid
            self._in_flight.discard(uid)
            moved = uid in self._moved_in_flight
            self._moved_in_flight.discard(uid)
            if uid not in self._pods:
                return  # deleted meanwhile
            now = time.monotonic()
            qp.backoff_until = now + (self._backoff_duration(qp.attempts) if backoff else 0.0)
            if uid in self._activate_in_flight:
                self._activate_in_flight.discard(uid)
                qp.backoff_until = 0.0
                self._push_active(qp)
            elif moved or self._move_request_cycle >= qp.cycle or self._event_since(qp):
                self._push_backoff(qp)  # something changed while it was being scheduled
            else:
                qp.unschedulable_since = now
                self._unschedulable[uid] = qp
                self._where[uid] = "unschedulable"

    def requeue_backoff(self, qp: QueuedPod) -> None:
        """An error (not a rejection), e.g. a failed bind: retry after backoff. A pod the
        watch deleted (or saw bound) meanwhile is not queued again."""
        with self._cond:
            uid = qp.pod.uid
            self._in_flight.discard(uid)
            self._moved_in_flight.discard(uid)
            if uid not in self._pods:
                return
            qp.backoff_until = time.monotonic() + self._backoff_duration(qp.attempts)
            self._push_backoff(qp)

    def move_all_to_active_or_backoff(self) -> None:
        """A cluster event that may make unschedulable pods schedulable."""
        with self._cond:
            now = time.monotonic()
            self._move_request_cycle = self.scheduling_cycle
            pods = list(self._unschedulable.values())
            self._unschedulable.clear()
            for qp in pods:
                self._move(qp, now)

    def _event_since(self, qp: QueuedPod) -> bool:
        """An event that may undo its rejection came since the pod was popped."""
        return any(c >= qp.cycle and self._cares(qp, e) for e, c in self._event_cycle.items())

    def _cares(
        self, qp: QueuedPod, event: str, hint: Callable[[PodInfo, str], bool] | None = None
    ) -> bool:
        if not qp.rejected_by:
            return True
        events_of = self.events_of
        return any(
            event in events_of.get(p, (event,)) and (hint is None or hint(qp.pod, p))
            for p in qp.rejected_by
        )

    def move_for_event(self, event: str, hint: Callable[[PodInfo, str], bool] | None = None) -> int:
        """Cluster event `event` (a ClusterEvent): moves the unschedulable pods a rejecting
        plugin of which registered it, and, given `hint(pod, plugin)`, says it may help; how
        many moved. A pod being scheduled when it comes goes to backoff instead of the
        unschedulable pods if it fails for a plugin that registered it."""
        with self._cond:
            now = time.monotonic()
            self._event_cycle[event] = self.scheduling_cycle
            moved = [qp for qp in self._unschedulable.values() if self._cares(qp, event, hint)]
            for qp in moved:
                del self._unschedulable[qp.pod.uid]
                self._move(qp, now)
            return len(moved)

    def move_to_active_or_backoff(self, uids: Iterable[str]) -> None:
        """What turned these pods away is gone (a gang's claim on a node): the unschedulable
        ones go to the active queue, or to backoff while it lasts; one being scheduled goes
        to backoff instead of the unschedulable pods if it fails."""
        with self._cond:
            now = time.monotonic()
            for uid in uids:
                where = self._where.get(uid)
                if where == "unschedulable":
                    self._move(self._unschedulable.pop(uid), now)
                elif where == "in_flight":
                    self._moved_in_flight.add(uid)

    def activate(self, uids: Iterable[str]) -> None:
        """Moves these pods from unschedulable or backoff to the active queue now."""
        with self._cond:
            for uid in uids:
                qp = self._pods.get(uid)
                where = self._where.get(uid)
                if qp is not None and where == "in_flight":
                    self._activate_in_flight.add(uid)  # handed back: straight to active
                if qp is None or where not in ("unschedulable", "backoff"):
                    continue
                self._unschedulable.pop(uid, None)
                qp.backoff_until = 0.0
                self._push_active(qp)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def counts(self) -> dict[str, int]:
        with self._cond:
            out = {"active": 0, "backoff": 0, "unschedulable": 0, "in_flight": 0}
            for where in self._where.values():
                out[where] = out.get(where, 0) + 1
            return out

    def has(self, uid: str) -> bool:
        with self._cond:
            return uid in self._pods
