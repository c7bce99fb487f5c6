"""The node's pods, read from the kubelet read-only port, else from the API server.

The kubelet's `/pods` (`http://127.0.0.1:10255/pods` by default) lists exactly
the pods the kubelet knows, which is what Allocate needs. Newer kubelets keep
that port closed; then the node's pods are listed from the API server by
`spec.nodeName` and the switch is logged once (and once more when the kubelet
port answers again).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lj_runtimekit.deviceplugin.internal.podlookup.watch import PodWatch

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class PodLookupError(Exception):
    """Neither the kubelet nor the API server gave the node's pods."""


@dataclass(frozen=True)
class ContainerInfo:
    """A container's name and its integer extended-resource limits."""

    name: str
    limits: Mapping[str, int]
    init: bool = False
    sidecar: bool = False
    """An init container with `restartPolicy: Always`: it runs beside the app containers."""

    @property
    def run_to_completion(self) -> bool:
        """An init container that ends before the app containers start (its devices are
        handed to them again by the kubelet)."""
        return self.init and not self.sidecar


@dataclass(frozen=True)
class PodInfo:
    """What Allocate needs of a pod."""

    namespace: str
    name: str
    uid: str
    phase: str
    deleting: bool
    creation: str
    annotations: Mapping[str, str]
    containers: tuple[ContainerInfo, ...]
    node_name: str = ""

    @property
    def ref(self) -> str:
        """`namespace/name`, for logs and messages."""
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """False for pods that finished or are being deleted."""
        return self.phase not in TERMINAL_PHASES and not self.deleting


def _count(value: object) -> int | None:
    """An extended-resource quantity as an integer, or None when it is not one."""
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    suffixes = {"k": 10**3, "M": 10**6, "G": 10**9}
    try:
        if text and text[-1] in suffixes:
            number = Decimal(text[:-1]) * suffixes[text[-1]]
        else:
            number = Decimal(text)
    except InvalidOperation:
        return None
    return int(number) if number == number.to_integral_value() and number >= 0 else None


def _containers(spec: Mapping[str, Any], key: str, init: bool) -> list[ContainerInfo]:
    out = []
    for c in spec.get(key) or ():
        resources = c.get("resources") or {}
        merged = dict(resources.get("requests") or {})
        merged.update(resources.get("limits") or {})
        limits = {}
        for name, value in merged.items():
            if "/" in name:
                number = _count(value)
                if number is not None:
                    limits[name] = number
        sidecar = init and c.get("restartPolicy") == "Always"
        out.append(ContainerInfo(str(c.get("name", "")), limits, init, sidecar))
    return out


def parse_pod(item: Mapping[str, Any]) -> PodInfo:
    """A PodInfo from one pod object of a PodList (JSON)."""
    meta = item.get("metadata") or {}
    spec = item.get("spec") or {}
    status = item.get("status") or {}
    return PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        phase=str(status.get("phase", "")),
        deleting=bool(meta.get("deletionTimestamp")),
        creation=str(meta.get("creationTimestamp", "")),
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        containers=tuple(
            _containers(spec, "initContainers", True) + _containers(spec, "containers", False)
        ),
        node_name=str(spec.get("nodeName", "")),
    )


def parse_pod_list(body: bytes, source: str) -> list[PodInfo]:
    """Parse a PodList; raise PodLookupError naming `source` when it is not one."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise PodLookupError(f"{source} did not answer a JSON PodList: {exc}") from exc
    # An empty node's list is `"items": null` (the kubelet encodes a nil slice that way).
    if not isinstance(data, dict) or not isinstance(data.get("items") or [], list):
        raise PodLookupError(f"{source} did not answer a PodList")
    return [parse_pod(item) for item in data.get("items") or () if isinstance(item, dict)]


class _ParsedCache:
    """The last answer and its parse: consecutive Allocate calls of one admission mostly
    see the same bytes, and comparing bytes is far cheaper than parsing them again."""

    def __init__(self) -> None:
        self._body: bytes | None = None
        self._pods: list[PodInfo] = []

    def parse(self, body: bytes, source: str) -> list[PodInfo]:
        if body != self._body:
            self._pods = parse_pod_list(body, source)
            self._body = body
        return list(self._pods)


class PodApi(Protocol):
    """The API server side: a PodList of the node as JSON bytes."""

    def list_node_pods(self, node_name: str) -> bytes:
        """The raw PodList of pods with `spec.nodeName == node_name`."""


class _KubeletHttp:
    """A keep-alive HTTP client of the kubelet's `/pods` (blocking; used from a thread)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"kubelet pods URL {url!r} is not an http(s) URL")
        self.url = url
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port
        self._path = parsed.path or "/pods"
        if parsed.query:
            self._path += "?" + parsed.query
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self._timeout_s)

    def get(self) -> bytes:
        with self._lock:
            for attempt in (1, 2):
                if self._conn is None:
                    self._conn = self._connect()
                try:
                    self._conn.request("GET", self._path, headers={"Accept": "application/json"})
                    response = self._conn.getresponse()
                    body = response.read()
                except (OSError, http.client.HTTPException):
                    self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise
                    continue
                if response.status != 200:
                    raise PodLookupError(f"kubelet {self.url} answered HTTP {response.status}")
                return body
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _AsyncKubeletHttp:
    """A keep-alive HTTP/1.1 GET of the kubelet's `/pods` on the event loop (plain http).

    No thread hand-off per call: Allocate latency matters, and the read-only
    port speaks plain HTTP. Handles Content-Length and chunked bodies.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"kubelet pods URL {url!r} is not an http URL")
        self.url = url
        self._host = parsed.hostname
        self._port = parsed.port or 80
        path = parsed.path or "/pods"
        self._request = (
            f"GET {path}{'?' + parsed.query if parsed.query else ''} HTTP/1.1\r\n"
            f"Host: {parsed.netloc}\r\nAccept: application/json\r\n\r\n"
        ).encode()
        self._timeout_s = timeout_s
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> bytes:
        async with self._lock:
            for attempt in (1, 2):
                try:
                    return await asyncio.wait_for(self._get_once(), self._timeout_s)
                except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError):
                    self._drop()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    async def _get_once(self) -> bytes:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._streams
        writer.write(self._request)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"not an HTTP answer: {status_line[:40]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while (size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)) > 0:
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            body = b"".join(chunks)
        elif "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = await reader.read()
            self._drop()
        if headers.get("connection", "").lower() == "close":
            self._drop()
        if status != 200:
            raise PodLookupError(f"kubelet {self.url} answered HTTP {status}")
        return body

    def _drop(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    def close(self) -> None:
        self._drop()

    async def aclose(self) -> None:
        if self._streams is not None:
            writer = self._streams[1]
            self._streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@dataclass
class _Source:
    on_kubelet: bool = True
    retry_kubelet_at: float = 0.0
    logged: set[str] = field(default_factory=set)


class NodePods:
    """Lists the node's pods: kubelet `/pods` first (when configured), else the API server.

    The API server side is one watch of the node's pods (`watch`) when given,
    else a LIST per call. `fresh()` is a LIST from the API server: the truth
    when the kubelet's copy may lag (a rejected pod stays Pending there until
    its status has gone round the API server).
    """

    def __init__(
        self,
        kubelet_url: str,
        node_name: str,
        api: PodApi | None,
        *,
        timeout_s: float = 2.0,
        kubelet_retry_s: float = 30.0,
        watch: PodWatch | None = None,
    ) -> None:
        self._kubelet: _KubeletHttp | _AsyncKubeletHttp | None = None
        if kubelet_url.startswith("http://"):
            self._kubelet = _AsyncKubeletHttp(kubelet_url, timeout_s)
        elif kubelet_url:
            self._kubelet = _KubeletHttp(kubelet_url, timeout_s)
        self.node_name = node_name
        self._api = api
        self._watch = watch
        self._timeout_s = timeout_s
        self._kubelet_retry_s = kubelet_retry_s
        self._source = _Source(on_kubelet=self._kubelet is not None)
        self._kubelet_cache = _ParsedCache()

    @property
    def kubelet_url(self) -> str:
        """Where the kubelet's pod list is read ("" when off)."""
        return self._kubelet.url if self._kubelet is not None else ""

    @property
    def from_kubelet(self) -> bool:
        """Whether the pod list comes from the kubelet's own `/pods` (else the API server)."""
        return self._source.on_kubelet

    @property
    def has_api(self) -> bool:
        """Whether the API server can be asked (for `fresh`)."""
        return self._api is not None and bool(self.node_name)

    def describe(self) -> str:
        """The pod sources, for the start-up log line."""
        parts = []
        if self._kubelet is not None:
            parts.append(f"kubelet {self._kubelet.url}")
        if self.has_api:
            parts.append("API server " + ("watch" if self._watch else "list"))
        return " then ".join(parts) or "none"

    async def list_pods(self) -> list[PodInfo]:
        """The node's pods, from whichever source answers."""
        src = self._source
        now = time.monotonic()
        kubelet = self._kubelet
        if kubelet is None:
            kubelet_error = "no kubelet pods URL configured"
        elif src.on_kubelet or now >= src.retry_kubelet_at:
            try:
                if isinstance(kubelet, _AsyncKubeletHttp):
                    body = await kubelet.get()
                else:
                    body = await asyncio.to_thread(kubelet.get)
            except (
                OSError,
                http.client.HTTPException,
                PodLookupError,
                ValueError,
                TimeoutError,
                asyncio.IncompleteReadError,
            ) as exc:
                kubelet_error = str(exc) or type(exc).__name__
                src.retry_kubelet_at = now + self._kubelet_retry_s
                if src.on_kubelet:
                    src.on_kubelet = False
                    self._log_once(
                        "fallback",
                        "kubelet pod list unavailable, reading the node's pods from the API"
                        " server instead",
                        {"url": kubelet.url, "node": self.node_name, "reason": kubelet_error},
                    )
            else:
                if not src.on_kubelet:
                    src.on_kubelet = True
                    log.info("kubelet pod list answers again", extra={"url": kubelet.url})
                return self._kubelet_cache.parse(body, f"kubelet {kubelet.url}")
        else:
            kubelet_error = "closed at last try"
        return await self._from_api(kubelet_error)

    def _no_source(self, kubelet_error: str, api_error: str) -> PodLookupError:
        where = (
            f"kubelet {self._kubelet.url} failed ({kubelet_error})"
            if self._kubelet
            else ("no kubelet pods URL is configured")
        )
        return PodLookupError(f"cannot list the node's pods: {where} and {api_error}")

    async def _from_api(self, kubelet_error: str) -> list[PodInfo]:
        if not self.has_api:
            raise self._no_source(
                kubelet_error,
                "there is no API server access with a node name to fall back to (set"
                " --node-name/NODE_NAME and run in-cluster or with --kubeconfig)",
            )
        if self._watch is not None:
            self._watch.start()
            if self._watch.synced or await asyncio.to_thread(
                self._watch.wait_synced, self._timeout_s
            ):
                return self._watch.pods()
        fresh = await self._list_api(kubelet_error)
        return fresh

    async def fresh(self) -> list[PodInfo] | None:
        """The node's pods as the API server has them now (a LIST); None without API access."""
        if not self.has_api:
            return None
        return await self._list_api("not asked")

    async def _list_api(self, kubelet_error: str) -> list[PodInfo]:
        api = self._api
        assert api is not None
        try:
            body = await asyncio.to_thread(api.list_node_pods, self.node_name)
        except Exception as exc:
            raise self._no_source(kubelet_error, f"the API server failed too: {exc}") from exc
        pods = parse_pod_list(body, "API server")
        return [p for p in pods if not p.node_name or p.node_name == self.node_name]

    def _log_once(self, key: str, message: str, fields: dict[str, object]) -> None:
        if key not in self._source.logged:
            self._source.logged.add(key)
            log.warning(message, extra=fields)

    def close(self) -> None:
        """Close the kubelet connection (the socket closes on the loop's next turn)."""
        if self._kubelet is not None:
            self._kubelet.close()
        if self._watch is not None:
            self._watch.stop()

    async def aclose(self) -> None:
        """Close the kubelet connection and wait until it is closed."""
        if self._watch is not None:
            self._watch.stop()
        if isinstance(self._kubelet, _AsyncKubeletHttp):
            await self._kubelet.aclose()
        elif self._kubelet is not None:
            self._kubelet.close()
