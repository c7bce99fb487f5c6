"""A thin JSON client over the official client's REST layer, with a QPS/burst limiter.

The hot paths (list, watch, bind, events) skip the generated model classes: the API
server's JSON is decoded straight into dicts, which is several times cheaper. Every
failure is a KubeError (`errors`); a watch from a too old resourceVersion is GoneError.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from lj_runtimekit.proto.pkg.kube.config import load_api_client
from lj_runtimekit.proto.pkg.kube.errors import api_error, kube_error

KubeObject = dict[str, Any]
"""An API object (or list) as the server's decoded JSON."""

MERGE_PATCH = "application/merge-patch+json"
"""JSON merge patch (RFC 7386): maps merge, null removes a key, lists are replaced."""
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
"""Kubernetes' strategic merge patch: as MERGE_PATCH, but lists merge by their keys."""


class RateLimiter:
    """Token bucket: `qps` tokens a second, at most `burst` saved (client-go's flowcontrol)."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Block until a token is there, and take it."""
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


class KubeClient:
    """JSON requests against the API server (blocking; one connection pool, thread-safe)."""

    def __init__(self, api: Any, limiter: RateLimiter | None = None) -> None:
        self.api = api
        """The official client's ApiClient (for the generated API classes where needed)."""
        self.limiter = limiter
        self.host: str = api.configuration.host

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None,
        pool_size: int | None = None,
        limiter: RateLimiter | None = None,
    ) -> KubeClient:
        """A client from `kubeconfig`, else in-cluster (`config.load_configuration`)."""
        return cls(load_api_client(kubeconfig, pool_size), limiter)

    def close(self) -> None:
        """Close the connection pool."""
        self.api.close()

    def _headers(self, query: dict[str, Any]) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        self.api.update_params_for_auth(headers, query, ["BearerToken"])
        return headers

    def request_bytes(
        self,
        method: str,
        path: str,
        body: object = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
        limited: bool = True,
    ) -> bytes:
        """The raw body of the answer to `method path` (`body` sent as JSON); KubeError
        unless it is a 2xx. `limited` requests wait for the rate limiter."""
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
        except Exception as exc:
            error = api_error(f"{method} {path}", exc)
            if error is None:
                raise
            raise error from None
        data: bytes = resp.data
        return data

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
        """`request_bytes` decoded ({} for an empty answer)."""
        data = self.request_bytes(method, path, body, query, content_type, timeout_s, limited)
        if not data:
            return {}
        out: KubeObject = json.loads(data)
        return out

    def list_all(
        self, path: str, params: Mapping[str, str] | None = None, page: int = 500
    ) -> tuple[list[KubeObject], str]:
        """Every item of a list (paginated; `params` such as a fieldSelector) and the
        list's resourceVersion."""
        items: list[KubeObject] = []
        cont = ""
        while True:
            query: dict[str, Any] = {**(params or {}), "limit": page}
            if cont:
                query["continue"] = cont
            data = self.request("GET", path, query=query, limited=False, timeout_s=120)
            items.extend(data.get("items") or ())
            meta = data.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, str(meta.get("resourceVersion", ""))

    def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, str] | None = None,
        timeout_s: int = 300,
    ) -> Iterator[tuple[str, KubeObject]]:
        """(type, object) events from `resource_version` (BOOKMARK events included) until the
        server ends the watch; GoneError when the version is too old, KubeError else."""
        what = f"WATCH {path}"
        query = {
            **(params or {}),
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
        except Exception as exc:
            error = api_error(what, exc)
            if error is None:
                raise
            raise error from None
        try:
            yield from self._events(what, resp)
        finally:
            resp.release_conn()

    @staticmethod
    def _events(what: str, resp: Any) -> Iterator[tuple[str, KubeObject]]:
        buf = b""
        chunks = resp.stream(1 << 16, decode_content=False)
        while True:
            try:
                chunk = next(chunks, None)
            except Exception as exc:  # the connection broke mid-stream
                error = api_error(what, exc)
                if error is None:
                    raise
                raise error from None
            if chunk is None:
                return
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
                    raise kube_error(
                        what,
                        int(obj.get("code", 0)),
                        str(obj.get("message")),
                        str(obj.get("reason") or ""),
                    )
                yield etype, obj
