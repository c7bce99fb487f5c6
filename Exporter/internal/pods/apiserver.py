"""API server fallback: the node's pods by `spec.nodeName` field selector.

Used only when the kubelet read-only port does not answer. It costs a LIST
against the API server per collection, so the kubelet stays the first choice.
The API client is built (and the official client imported) on the first list.
"""

from __future__ import annotations

import asyncio
import threading

from lj_runtimekit.exporter.internal.pods.kubelet import PodSourceError
from lj_runtimekit.exporter.internal.pods.model import Pod, PodListError, parse_pod_list
from lj_runtimekit.proto.pkg.kube import KubeClient, KubeConfigError, KubeError


class ApiServerPods:
    """Lists the pods bound to one node through the API server."""

    def __init__(self, node_name: str, kubeconfig: str | None, timeout_s: float = 10.0) -> None:
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self.timeout_s = timeout_s
        self._kube: KubeClient | None = None
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        """Description for log lines and errors."""
        origin = f"kubeconfig {self.kubeconfig}" if self.kubeconfig else "in-cluster config"
        return f"API server ({origin}) pods of node {self.node_name}"

    def _client(self) -> KubeClient:
        with self._lock:
            if self._kube is None:
                try:
                    self._kube = KubeClient.connect(self.kubeconfig)
                except KubeConfigError as exc:
                    raise PodSourceError(f"{self.where}: cannot load config: {exc}") from exc
            return self._kube

    def _fetch(self) -> tuple[Pod, ...]:
        kube = self._client()
        try:
            data = kube.request(
                "GET",
                "/api/v1/pods",
                query={"fieldSelector": f"spec.nodeName={self.node_name}"},
                timeout_s=self.timeout_s,
            )
        except (KubeError, ValueError) as exc:
            raise PodSourceError(f"{self.where}: {exc}") from exc
        try:
            return parse_pod_list(data, self.where)
        except PodListError as exc:
            raise PodSourceError(str(exc)) from exc

    async def list_pods(self) -> tuple[Pod, ...]:
        """The node's pods; raise PodSourceError when the API server cannot be read."""
        return await asyncio.to_thread(self._fetch)
