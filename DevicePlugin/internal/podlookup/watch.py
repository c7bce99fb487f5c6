"""The node's pods from one API server watch (field selector `spec.nodeName`).

Used when the kubelet's read-only port is closed: the shared informer lists the
node's pods once, then watches them and keeps a local copy, instead of a LIST per
Allocate. A broken watch is retried with backoff and resumes (listing again when
its version expired); until the first list the copy is not `synced`.
"""

from __future__ import annotations

import threading

from lj_runtimekit.deviceplugin.internal.podlookup.lookup import (
    PodInfo,
    node_selector,
    on_node,
    parse_pod,
)
from lj_runtimekit.proto.pkg.kube import Informer, KubeClient, KubeObject

_DELETED_KEPT = 1000


class PodWatch:
    """A watch-fed copy of the node's pods, read from the event loop."""

    def __init__(self, kube: KubeClient, node_name: str) -> None:
        self._node = node_name
        self._pods: dict[str, PodInfo] = {}
        self._deleted: dict[str, PodInfo] = {}
        """Pods deleted while Pending, by UID (oldest first, bounded): the kubelet may still
        admit such a pod (see `deleted_pending`)."""
        self._lock = threading.Lock()
        self._informer = Informer(
            kube,
            "/api/v1/pods",
            self._on_pod,
            "node-pods",
            params=node_selector(node_name),
            initial_backoff_s=0.2,
        )

    @property
    def synced(self) -> bool:
        """True once the first list is in."""
        return self._informer.synced.is_set()

    def start(self) -> None:
        """Start the watch thread (once)."""
        self._informer.start()

    def pods(self) -> list[PodInfo]:
        """The node's pods as the watch last saw them."""
        with self._lock:
            return list(self._pods.values())

    def deleted_pending(self) -> list[PodInfo]:
        """Pods the watch saw deleted while Pending, not yet forgotten."""
        with self._lock:
            return list(self._deleted.values())

    def forget_deleted(self, uid: str) -> None:
        """Stop reporting a deleted pod."""
        with self._lock:
            self._deleted.pop(uid, None)

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the first list is in (or `timeout_s`)."""
        return self._informer.synced.wait(timeout_s)

    def stop(self) -> None:
        """End the watch thread at its next event or timeout."""
        self._informer.stop()

    def _on_pod(self, etype: str, obj: KubeObject) -> None:
        pod = parse_pod(obj)
        with self._lock:
            if etype == "DELETED" or not on_node(pod, self._node):
                self._pods.pop(pod.uid, None)
                if etype == "DELETED" and pod.phase == "Pending" and on_node(pod, self._node):
                    self._deleted[pod.uid] = pod
                    while len(self._deleted) > _DELETED_KEPT:
                        self._deleted.pop(next(iter(self._deleted)))
            else:
                self._pods[pod.uid] = pod
