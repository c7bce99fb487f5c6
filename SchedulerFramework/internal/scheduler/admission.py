"""One device pod in admission per node: how the Device Plugin knows whose devices it serves.

The kubelet's Allocate names device IDs, never a pod. The scheduler therefore
binds a device pod (one it assigned devices to) to a node only while no other
device pod bound there is still waiting for its admission outcome; the
outcome is what the pod shows on the API server: the Device Plugin's record
`bind phase = allocated`, or a phase past Pending (Running, Succeeded,
Failed: a kubelet that rejected the pod marks it Failed), or the pod's
deletion. The Device Plugin then serves exactly that pod (docs/protocol.md).

Bindings for a node that is busy wait here, first come first served, without
holding a binding worker or a bind slot. Placement is not changed by it
(binpack still fills the fullest node): while the scheduling loop assigns pods
faster than nodes admit them, many nodes have a queue and drain side by side.
The holders are rebuilt from the pods after a restart (a bound pod whose bind
phase is still `allocating` holds its node), so a new scheduler never binds
beside a pod still in admission. There is no timer: a node whose kubelet never
answers stays closed to device pods, which is right, as nothing could be
admitted there.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Generic, TypeVar

from lj_runtimekit.proto.pkg.protocol import BIND_PHASE_ALLOCATED
from lj_runtimekit.schedulerframework.internal.cache.podinfo import KubeObject
from lj_runtimekit.schedulerframework.internal.scheduler import metrics

SETTLED_PHASES = frozenset({"Running", "Succeeded", "Failed"})

T = TypeVar("T")


def in_admission(obj: KubeObject, assigned_key: str, bind_phase_key: str) -> bool:
    """Whether a pod is bound with a device assignment and its admission is not settled."""
    meta: Mapping[str, object] = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    assert isinstance(annotations, dict)
    if not (obj.get("spec") or {}).get("nodeName") or assigned_key not in annotations:
        return False
    if annotations.get(bind_phase_key) == BIND_PHASE_ALLOCATED:
        return False
    return (obj.get("status") or {}).get("phase") not in SETTLED_PHASES


class AdmissionGate(Generic[T]):
    """Per node: the device pods in admission and the bindings waiting for the node."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[str, set[str]] = {}
        self._node_of: dict[str, str] = {}
        self._since: dict[str, float] = {}
        self._queued: dict[str, deque[tuple[str, T]]] = {}

    def enter(self, node: str, uid: str, item: T) -> bool:
        """True when `uid` may bind to `node` now (it holds the node from here on); else
        `item` waits and comes back from `leave` when the node is free."""
        with self._lock:
            if self._holders.get(node):
                self._queued.setdefault(node, deque()).append((uid, item))
                metrics.ADMISSION_QUEUED.inc()
                return False
            self._hold(node, uid)
            return True

    def hold(self, node: str, uid: str) -> None:
        """Record a pod seen in admission on `node` (after a restart, or another binder)."""
        with self._lock:
            if self._node_of.get(uid) != node:
                self._hold(node, uid)

    def _hold(self, node: str, uid: str) -> None:
        self._holders.setdefault(node, set()).add(uid)
        self._node_of[uid] = node
        self._since[uid] = time.monotonic()

    def leave(self, uid: str) -> T | None:
        """`uid`'s admission is over (settled, deleted, or its binding failed): the next
        waiting binding for the node, which now holds it, or None."""
        with self._lock:
            node = self._node_of.pop(uid, None)
            if node is None:
                return None
            since = self._since.pop(uid, None)
            if since is not None:
                metrics.ADMISSION_SECONDS.observe(time.monotonic() - since)
            holders = self._holders.get(node, set())
            holders.discard(uid)
            if holders:
                return None
            self._holders.pop(node, None)
            queue = self._queued.get(node)
            if not queue:
                self._queued.pop(node, None)
                return None
            next_uid, item = queue.popleft()
            if not queue:
                del self._queued[node]
            metrics.ADMISSION_QUEUED.dec()
            self._hold(node, next_uid)
            return item

    def cancel(self, uid: str) -> T | None:
        """Take a waiting binding out (its pod was deleted); the item, or None."""
        with self._lock:
            for node, queue in list(self._queued.items()):
                for entry in queue:
                    if entry[0] == uid:
                        queue.remove(entry)
                        metrics.ADMISSION_QUEUED.dec()
                        if not queue:
                            del self._queued[node]
                        return entry[1]
        return None

    def holders(self, node: str) -> set[str]:
        """The pods in admission on `node`."""
        with self._lock:
            return set(self._holders.get(node, ()))

    def queued(self) -> int:
        """Bindings waiting for their node."""
        with self._lock:
            return sum(len(q) for q in self._queued.values())
