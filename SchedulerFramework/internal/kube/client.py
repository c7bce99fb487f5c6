"""A thin JSON client over the kubernetes package's REST layer, with a QPS/burst limiter.

The hot path (list, watch, bind, events) skips the generated models: the API
server's JSON is decoded straight into dicts, which is several times cheaper.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from lj_runtimekit.schedulerframework.internal.cache.podinfo import KubeObject

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """An API request that failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, method: str, path: str, status: int, reason: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


class RateLimiter:
    """Token bucket: `qps` tokens a second, at most `burst` saved (client-go's flowcontrol)."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def wait(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                need = (1 - self._tokens) / self.qps
            time.sleep(need)


def load_api_client(kubeconfig: str | None, pool_size: int = 64) -> k8s_client.ApiClient:
    """From a kubeconfig file, else in-cluster; ConfigException names what is missing."""
    configuration = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise ConfigException(
                f"no --kubeconfig given and not running in a cluster: {exc}"
            ) from None
    configuration.connection_pool_maxsize = pool_size
    return k8s_client.ApiClient(configuration)


class Kube:
    """JSON requests against the API server."""

    def __init__(self, api: k8s_client.ApiClient, limiter: RateLimiter | None = None) -> None:
        self.api = api
        self.limiter = limiter
        self.host = api.configuration.host

    def _headers(self, query: dict[str, Any]) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        self.api.update_params_for_auth(headers, query, ["BearerToken"])
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
        limited: bool = True,
    ) -> KubeObject:
        if limited and self.limiter is not None:
            self.limiter.wait()
        q = dict(query or {})
        headers = self._headers(q)
        headers["Content-Type"] = content_type
        url = self.host + path + (("?" + urlencode(q)) if q else "")
        try:
            resp = self.api.rest_client.request(
                method,
                url,
                headers=headers,
                body=body,
                _preload_content=False,
                _request_timeout=timeout_s,
            )
        except ApiException as exc:
            reason = str(exc.reason)
            with contextlib.suppress(ValueError, AttributeError):
                reason = json.loads(exc.body or "{}").get("message") or reason
            raise KubeError(method, path, int(exc.status or 0), reason) from None
        except Exception as exc:
            raise KubeError(method, path, 0, str(exc)) from None
        data = resp.data
        if not data:
            return {}
        out: KubeObject = json.loads(data)
        return out

    def list_all(self, path: str, page: int = 500) -> tuple[list[KubeObject], str]:
        """Every item of a list (paginated) and the list's resourceVersion."""
        items: list[KubeObject] = []
        cont = ""
        while True:
            query: dict[str, Any] = {"limit": page}
            if cont:
                query["continue"] = cont
            data = self.request("GET", path, query=query, limited=False, timeout_s=120)
            items.extend(data.get("items") or ())
            meta = data.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, str(meta.get("resourceVersion", ""))

    def watch(
        self, path: str, resource_version: str, timeout_s: int = 300
    ) -> Iterator[tuple[str, KubeObject]]:
        """(type, object) events from `resource_version`; KubeError(410) when it is too old."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
        }
        headers = self._headers(query)
        url = self.host + path + "?" + urlencode(query)
        try:
            resp = self.api.rest_client.request(
                "GET",
                url,
                headers=headers,
                _preload_content=False,
                _request_timeout=(10, timeout_s + 30),
            )
        except ApiException as exc:
            raise KubeError("WATCH", path, int(exc.status or 0), str(exc.reason)) from None
        try:
            buf = b""
            for chunk in resp.stream(1 << 16, decode_content=False):
                buf += chunk
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line, buf = buf[:nl], buf[nl + 1 :]
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    etype = str(event.get("type", ""))
                    obj = event.get("object") or {}
                    if etype == "ERROR":
                        raise KubeError(
                            "WATCH", path, int(obj.get("code", 0)), str(obj.get("message"))
                        )
                    yield etype, obj
        finally:
            resp.release_conn()
