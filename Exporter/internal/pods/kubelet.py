"""The node's pods from the kubelet's `/pods`; every failure is a PodSourceError naming the URL."""

from __future__ import annotations

import json

from lj_runtimekit.exporter.internal.pods.model import Pod, PodListError, parse_pod_list
from lj_runtimekit.proto.pkg.kubeletpods import (
    DEFAULT_KUBELET_PODS_URL,
    KubeletPodsError,
    KubeletPodsReader,
)


class PodSourceError(ConnectionError):
    """The pods could not be read; the message names the source and the cause."""


class KubeletPods:
    """Reads the node's pods from the kubelet's `/pods` endpoint."""

    def __init__(self, url: str = DEFAULT_KUBELET_PODS_URL, timeout_s: float = 5.0) -> None:
        self._reader = KubeletPodsReader(url, timeout_s)
        self.url = url

    async def list_pods(self) -> tuple[Pod, ...]:
        """The node's pods; raise PodSourceError when the kubelet cannot be read."""
        try:
            body = await self._reader.get()
        except KubeletPodsError as exc:
            raise PodSourceError(str(exc)) from exc
        try:
            return parse_pod_list(json.loads(body), f"kubelet {self.url}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PodSourceError(f"kubelet {self.url} did not answer JSON: {exc}") from exc
        except PodListError as exc:
            raise PodSourceError(str(exc)) from exc

    async def aclose(self) -> None:
        """Close the connections to the kubelet."""
        await self._reader.aclose()
