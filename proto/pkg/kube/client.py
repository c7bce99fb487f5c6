"""A thin JSON client of the API server on urllib3, with a QPS/burst limiter.

No generated model classes: the API server's JSON is decoded straight into dicts,
which is several times cheaper, and the official client is never imported (about
75 MB). Every failure is a KubeError (`errors`); a watch from a too old
resourceVersion is GoneError.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3

from lj_runtimekit.proto.pkg.kube.config import ApiAccess, load_access
from lj_runtimekit.proto.pkg.kube.errors import api_error, kube_error, status_fields

KubeObject = dict[str, Any]
"""An API object (or list) as the server's decoded JSON."""

MERGE_PATCH = "application/merge-patch+json"
"""JSON merge patch (RFC 7386): maps merge, null removes a key, lists are replaced."""
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
"""Kubernetes' strategic merge patch: as MERGE_PATCH, but lists merge by their keys."""
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Accept header of a list answered with the objects' metadata only (client-go's metadata
client): a fraction of the bytes and memory of the full objects."""
CONNECT_TIMEOUT_S = 5.0
"""Longest wait for a connection, whatever a request's own timeout."""


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


class WatchCanceller:
    """Ends a watch (`KubeClient.watch`) from another thread: `cancel` shuts its
    connection down, so a read blocked on the stream returns at once and the watch ends."""

    def __init__(self) -> None:
        self.cancelled = False
        self._response: Any = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """End the watch open now, and any watch opened with this canceller later."""
        with self._lock:
            self.cancelled = True
            if self._response is not None:
                _shut_down(self._response)

    def _open(self, response: Any) -> None:
        with self._lock:
            self._response = response
            if self.cancelled:
                _shut_down(response)

    def _close(self) -> None:
        with self._lock:
            self._response = None


def _shut_down(response: Any) -> None:
    """Shut the socket of a streamed answer down (both ways; TLS or not)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class KubeClient:
    """JSON requests against the API server (blocking; one connection pool, thread-safe)."""

    def __init__(
        self, access: Any, limiter: RateLimiter | None = None, pool_size: int | None = None
    ) -> None:
        """`access`: an ApiAccess, or an official client's ApiClient to take it from;
        `pool_size` connections are kept open (default: 5 per CPU, as the official client)."""
        if not isinstance(access, ApiAccess):
            access = ApiAccess.from_configuration(access.configuration)
        self.access = access
        self.limiter = limiter
        self.host: str = access.server
        self._pools = _pool_manager(access, pool_size or (os.cpu_count() or 1) * 5)
        self._pool = self._pools.connection_from_url(self.host)
        """The API server's pool, looked up once: a request names only its target (the pool
        manager parses every URL and builds a pool key per request, a quarter of a small
        request's CPU)."""
        self._prefix = (urllib3.util.parse_url(self.host).path or "").rstrip("/")
        """The server URL's path, before every request path (e.g. behind a proxy)."""

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None,
        pool_size: int | None = None,
        limiter: RateLimiter | None = None,
    ) -> KubeClient:
        """A client from `kubeconfig`, else in-cluster (`config.load_access`)."""
        return cls(load_access(kubeconfig), limiter, pool_size)

    def close(self) -> None:
        """Close every pooled connection (the client opens new ones when used again)."""
        self._pools.clear()
        self._pool = self._pools.connection_from_url(self.host)

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        auth = self.access.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    def _send(
        self,
        what: str,
        method: str,
        target: str,
        headers: dict[str, str],
        body: object,
        timeout: urllib3.Timeout,
    ) -> Any:
        """The answer to `method target` (path and query; its body not read yet); KubeError
        unless it is a 2xx."""
        try:
            resp = self._pool.urlopen(
                method,
                self._prefix + target,
                body=body if body is None or isinstance(body, bytes | str) else json.dumps(body),
                headers=headers,
                timeout=timeout,
                preload_content=False,
                redirect=False,
            )
        except Exception as exc:
            error = api_error(what, exc)
            if error is None:
                raise
            raise error from None
        if 200 <= resp.status < 300:
            return resp
        try:
            text = resp.read()
        except Exception:  # the connection broke while the error was read
            text = b""
        finally:
            resp.release_conn()
        message, reason = status_fields(text)
        raise kube_error(what, resp.status, message or resp.reason or "", reason)

    def request_bytes(
        self,
        method: str,
        path: str,
        body: object = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
        limited: bool = True,
        accept: str = "application/json",
    ) -> bytes:
        """The raw body of the answer to `method path` (`body` sent as JSON, bytes and str
        as they are); KubeError unless it is a 2xx. `timeout_s` bounds the wait for each
        part of the answer (a connection: at most CONNECT_TIMEOUT_S). `limited` requests
        wait for the rate limiter."""
        if limited and self.limiter is not None:
            self.limiter.wait()
        what = f"{method} {path}"
        headers = self._headers(content_type)
        headers["Accept"] = accept
        target = path + (("?" + urlencode(dict(query))) if query else "")
        timeout = urllib3.Timeout(connect=min(CONNECT_TIMEOUT_S, timeout_s), read=timeout_s)
        resp = self._send(what, method, target, headers, body, timeout)
        try:
            data: bytes = resp.read()
        except Exception as exc:
            error = api_error(what, exc)
            if error is None:
                raise
            raise error from None
        finally:
            resp.release_conn()
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
        accept: str = "application/json",
    ) -> KubeObject:
        """`request_bytes` decoded ({} for an empty answer)."""
        data = self.request_bytes(
            method, path, body, query, content_type, timeout_s, limited, accept
        )
        if not data:
            return {}
        out: KubeObject = json.loads(data)
        return out

    def pages(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        page: int = 500,
        metadata_only: bool = False,
        timeout_s: float = 120.0,
    ) -> Iterator[KubeObject]:
        """A list, one answer of at most `page` items at a time (limit/continue; `params`
        such as a labelSelector). `metadata_only`: items carry only apiVersion, kind and
        metadata (see METADATA_LIST)."""
        accept = METADATA_LIST if metadata_only else "application/json"
        cont = ""
        while True:
            query: dict[str, Any] = {**(params or {}), "limit": page}
            if cont:
                query["continue"] = cont
            data = self.request(
                "GET", path, query=query, limited=False, timeout_s=timeout_s, accept=accept
            )
            yield data
            cont = (data.get("metadata") or {}).get("continue") or ""
            if not cont:
                return

    def list_all(
        self, path: str, params: Mapping[str, str] | None = None, page: int = 500
    ) -> tuple[list[KubeObject], str]:
        """Every item of a list (paginated; `params` such as a fieldSelector) and the
        list's resourceVersion."""
        items: list[KubeObject] = []
        version = ""
        for data in self.pages(path, params, page):
            items.extend(data.get("items") or ())
            version = str((data.get("metadata") or {}).get("resourceVersion", ""))
        return items, version

    def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, str] | None = None,
        timeout_s: int = 300,
        canceller: WatchCanceller | None = None,
    ) -> Iterator[tuple[str, KubeObject]]:
        """(type, object) events from `resource_version` (BOOKMARK events included) until the
        server ends the watch or `canceller` cancels it; GoneError when the version is too
        old, KubeError else (a cancelled watch may end with one)."""
        what = f"WATCH {path}"
        query = {
            **(params or {}),
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
        }
        target = path + "?" + urlencode(query)
        # The server ends the watch after timeout_s; the read bound catches a dead stream.
        timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=timeout_s + 30)
        resp = self._send(what, "GET", target, self._headers(), None, timeout)
        if canceller is not None:
            canceller._open(resp)
        try:
            yield from self._events(what, resp)
        finally:
            if canceller is not None:
                canceller._close()
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


def _ssl_context(access: ApiAccess) -> ssl.SSLContext:
    """One TLS context for every connection of the pool (CA, client certificate)."""
    ctx = urllib3.util.ssl_.create_urllib3_context()
    if access.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif access.ca_path or access.ca_data:
        ctx.load_verify_locations(
            cafile=access.ca_path, cadata=access.ca_data.decode() if access.ca_data else None
        )
    else:
        ctx.load_default_certs()
    if access.cert_path or access.cert_data:
        with contextlib.ExitStack() as stack:
            cert = access.cert_path or stack.enter_context(_pem_file(access.cert_data))
            key = access.key_path or (
                stack.enter_context(_pem_file(access.key_data)) if access.key_data else None
            )
            ctx.load_cert_chain(cert, key)
    return ctx


@contextlib.contextmanager
def _pem_file(data: bytes | None) -> Iterator[str]:
    """`data` in a private file for as long as the TLS context loads it."""
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data or b"")
        yield path
    finally:
        os.unlink(path)


def _pool_manager(access: ApiAccess, pool_size: int) -> urllib3.PoolManager:
    """Connections to the API server, at most `pool_size` kept open; no retries here (the
    callers retry what is worth it, with their own bounds)."""
    options: dict[str, Any] = {"num_pools": 4, "maxsize": pool_size, "retries": False}
    if access.server.startswith("https:"):
        options["ssl_context"] = _ssl_context(access)
        if access.insecure:
            options["cert_reqs"] = "CERT_NONE"
            options["assert_hostname"] = False
        if access.tls_server_name:
            options["server_hostname"] = access.tls_server_name
    return urllib3.PoolManager(**options)
