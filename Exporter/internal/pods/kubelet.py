"""The kubelet read-only port: `GET /pods` returns the node's PodList, unauthenticated.

The read-only port (10255) is deprecated and off by default in newer kubelets
(kubernetes PR #100335), so the URL is a flag and every failure is reported as
a PodSourceError naming the URL.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from lj_runtimekit.exporter.internal.pods.model import Pod, PodListError, parse_pod_list

DEFAULT_KUBELET_PODS_URL = "http://127.0.0.1:10255/pods"


class PodSourceError(ConnectionError):
    """The pods could not be read; the message names the source and the cause."""


def check_pods_url(url: str) -> str | None:
    """A problem with a kubelet pods URL, or None when it is usable."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"{url!r} must be an http:// or https:// URL, e.g. {DEFAULT_KUBELET_PODS_URL}"
    if not parts.hostname:
        return f"{url!r} has no host, e.g. {DEFAULT_KUBELET_PODS_URL}"
    try:
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError:
        return f"{url!r} has an invalid port"
    return None


class KubeletPods:
    """Reads the node's pods from the kubelet's `/pods` endpoint."""

    def __init__(self, url: str = DEFAULT_KUBELET_PODS_URL, timeout_s: float = 5.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def _fetch(self) -> tuple[Pod, ...]:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})  # noqa: S310 (scheme checked by check_pods_url)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                body = response.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            raise PodSourceError(f"kubelet {self.url} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise PodSourceError(f"kubelet {self.url} not reachable: {reason}") from exc
        try:
            return parse_pod_list(json.loads(body), f"kubelet {self.url}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PodSourceError(f"kubelet {self.url} did not answer JSON: {exc}") from exc
        except PodListError as exc:
            raise PodSourceError(str(exc)) from exc

    async def list_pods(self) -> tuple[Pod, ...]:
        """The node's pods; raise PodSourceError when the kubelet cannot be read."""
        return await asyncio.to_thread(self._fetch)
