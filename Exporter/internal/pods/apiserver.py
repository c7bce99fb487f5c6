"""The node's pods from one API server watch (field selector `spec.nodeName`).

Used while the kubelet read-only port does not answer, or instead of it
(`--kubelet-pods-url ""`). The shared informer lists the node's pods once,
then watches them and keeps a copy here; a collection only reads that copy.
In steady state the API server sees one watch request per node every five
minutes (the server ends each watch then; bookmarks keep its version fresh),
and a list only when that version has expired. The client is built and the
watch started on the first read; a broken watch is retried with backoff while
the last copy stays served (`problem` says why). `stop` ends the watch and drops
the copy (the fallback's kubelet answers again); the next read lists anew.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from lj_runtimekit.exporter.internal.pods.kubelet import PodSourceError
from lj_runtimekit.exporter.internal.pods.model import Pod, PodListError, parse_pod
from lj_runtimekit.proto.pkg.kube import Informer, KubeClient, KubeConfigError, KubeObject

log = logging.getLogger(__name__)


class ApiServerPods:
    """A watch-fed copy of the pods bound to one node."""

    def __init__(
        self, node_name: str, kubeconfig: str | None, sync_timeout_s: float = 10.0
    ) -> None:
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self.sync_timeout_s = sync_timeout_s
        """Longest wait of a read for the first list."""
        self._kube: KubeClient | None = None
        self._informer: Informer | None = None
        self._started: list[Informer] = []
        self._pods: dict[str, Pod] = {}
        """The current informer's copy; a stopped one writes to its own, dropped dict."""
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        """Description for log lines and errors."""
        origin = f"kubeconfig {self.kubeconfig}" if self.kubeconfig else "in-cluster config"
        return f"API server ({origin}) pods of node {self.node_name}"

    @property
    def problem(self) -> str | None:
        """Why the watch is broken while its last copy is served; None while it works."""
        informer = self._informer
        if informer is None or informer.error is None:
            return None
        return f"{self.where}: watch broken, serving its last copy: {informer.error}"

    @property
    def watching(self) -> bool:
        """Whether a watch's thread runs, a stopped one's included until it has ended."""
        self._started = [i for i in self._started if i.running]
        return bool(self._started)

    def start(self) -> Informer:
        """Start the watch unless it runs (the client is built once); PodSourceError
        without credentials."""
        with self._lock:
            if self._informer is None:
                if self._kube is None:
                    try:
                        self._kube = KubeClient.connect(self.kubeconfig)
                    except KubeConfigError as exc:
                        raise PodSourceError(f"{self.where}: cannot load config: {exc}") from exc
                pods: dict[str, Pod] = {}
                self._pods = pods
                self._informer = Informer(
                    self._kube,
                    "/api/v1/pods",
                    lambda etype, obj: self._on_pod(pods, etype, obj),
                    "node-pods",
                    params={"fieldSelector": f"spec.nodeName={self.node_name}"},
                )
                self._informer.start()
                self._started = [*(i for i in self._started if i.running), self._informer]
            return self._informer

    def stop(self) -> None:
        """End the watch (its open request is cut) and drop its copy; a later read
        starts a new one."""
        with self._lock:
            informer, self._informer = self._informer, None
            self._pods = {}
        if informer is not None:
            informer.stop()

    async def list_pods(self) -> tuple[Pod, ...]:
        """The node's pods as the watch last saw them; PodSourceError until the first list."""
        informer = self.start()
        if not informer.synced.is_set():
            await asyncio.to_thread(informer.synced.wait, self.sync_timeout_s)
            if not informer.synced.is_set():
                reason = informer.error or f"no answer within {self.sync_timeout_s:g} s"
                raise PodSourceError(f"{self.where}: not listed yet: {reason}")
        with self._lock:
            return tuple(self._pods.values())

    def _on_pod(self, pods: dict[str, Pod], etype: str, obj: KubeObject) -> None:
        try:
            pod = parse_pod(obj, f"{self.where}: watched pod")
        except PodListError as exc:
            log.warning("pod ignored", extra={"reason": str(exc)})
            return
        with self._lock:
            if etype == "DELETED":
                pods.pop(pod.uid, None)
            else:
                pods[pod.uid] = pod
