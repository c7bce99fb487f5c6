"""The node's pods from one API server watch (field selector `spec.nodeName`).

Used when the kubelet's read-only port is closed: one LIST, then a watch that
keeps a local copy, instead of a LIST per Allocate. A broken watch lists again
(tenacity backoff) and resumes; until the first list the copy is not `synced`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from tenacity import Retrying, retry_if_exception_type, wait_exponential

from lj_runtimekit.deviceplugin.internal.podlookup.lookup import (
    PodInfo,
    parse_pod,
    parse_pod_list,
)

log = logging.getLogger(__name__)


class WatchApi(Protocol):
    """The API server calls a pod watch needs."""

    def list_node_pods(self, node_name: str) -> bytes:
        """The raw PodList of pods with `spec.nodeName == node_name`."""

    def watch_node_pods(
        self, node_name: str, resource_version: str, stop: threading.Event
    ) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(event type, pod object) of the node's pods from `resource_version` on."""


class PodWatch:
    """A watch-fed copy of the node's pods, read from the event loop."""

    def __init__(self, api: WatchApi, node_name: str) -> None:
        self._api = api
        self._node = node_name
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0
        """LIST calls made (the first sync, and one per broken watch)."""

    @property
    def synced(self) -> bool:
        """True once the first list is in."""
        return self._synced.is_set()

    def start(self) -> None:
        """Start the watch thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
            self._thread.start()

    def pods(self) -> list[PodInfo]:
        """The node's pods as the watch last saw them."""
        with self._lock:
            return list(self._pods.values())

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the first list is in (or `timeout_s`)."""
        return self._synced.wait(timeout_s)

    def stop(self) -> None:
        """End the watch thread at its next event or timeout."""
        self._stop.set()

    def _run(self) -> None:
        retrying = Retrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=0.2, max=10),
            before_sleep=lambda state: log.warning(
                "pod watch broken, listing again",
                extra={
                    "node": self._node,
                    "reason": str(state.outcome.exception()) if state.outcome else "",
                },
            ),
        )
        while not self._stop.is_set():
            for attempt in retrying:
                with attempt:
                    self._list_and_watch()
                    if self._stop.is_set():
                        return

    def _list_and_watch(self) -> None:
        body = self._api.list_node_pods(self._node)
        self.lists += 1
        version = str((json.loads(body).get("metadata") or {}).get("resourceVersion", ""))
        listed = {p.uid: p for p in parse_pod_list(body, "API server") if self._ours(p)}
        with self._lock:
            self._pods = listed
        self._synced.set()
        for etype, obj in self._api.watch_node_pods(self._node, version, self._stop):
            if etype == "ERROR":
                raise RuntimeError(f"watch error: {obj.get('message', obj)}")
            pod = parse_pod(obj)
            with self._lock:
                if etype == "DELETED" or not self._ours(pod):
                    self._pods.pop(pod.uid, None)
                else:
                    self._pods[pod.uid] = pod

    def _ours(self, pod: PodInfo) -> bool:
        return not pod.node_name or pod.node_name == self._node
