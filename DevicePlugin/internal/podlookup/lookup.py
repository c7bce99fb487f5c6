"""The node's pods, read from the kubelet read-only port, else from the API server.

The kubelet's `/pods` (`http://127.0.0.1:10255/pods` by default) lists exactly
the pods the kubelet knows, which is what Allocate needs. Newer kubelets keep
that port closed; then the node's pods are listed from the API server by
`spec.nodeName` and the switch is logged once (and once more when the kubelet
port answers again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from lj_runtimekit.proto.pkg.kube import KubeClient, KubeError
from lj_runtimekit.proto.pkg.kubeletpods import KubeletPodsError, KubeletPodsReader

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


def node_selector(node_name: str) -> dict[str, str]:
    """The query that narrows an API server pod list or watch to the pods of `node_name`."""
    return {"fieldSelector": f"spec.nodeName={node_name}"}


def on_node(pod: PodInfo, node_name: str) -> bool:
    """Whether `pod` is (or may be) this node's: bound to it, or not yet bound."""
    return not pod.node_name or pod.node_name == node_name


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
        kube: KubeClient | None,
        *,
        timeout_s: float = 2.0,
        kubelet_retry_s: float = 30.0,
        watch: PodWatch | None = None,
    ) -> None:
        self._kubelet = KubeletPodsReader(kubelet_url, timeout_s) if kubelet_url else None
        self.node_name = node_name
        self._kube = kube
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
        return self._kube is not None and bool(self.node_name)

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
                body = await kubelet.get()
            except KubeletPodsError as exc:
                kubelet_error = exc.reason
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
        kube = self._kube
        assert kube is not None
        try:
            body = await asyncio.to_thread(
                kube.request_bytes, "GET", "/api/v1/pods", query=node_selector(self.node_name)
            )
        except KubeError as exc:
            raise self._no_source(kubelet_error, f"the API server failed too: {exc}") from exc
        pods = parse_pod_list(body, "API server")
        return [p for p in pods if on_node(p, self.node_name)]

    def _log_once(self, key: str, message: str, fields: dict[str, object]) -> None:
        if key not in self._source.logged:
            self._source.logged.add(key)
            log.warning(message, extra=fields)

    def deleted_pending(self) -> list[PodInfo]:
        """Pods the API server watch saw deleted while Pending (none without a watch)."""
        return self._watch.deleted_pending() if self._watch is not None else []

    def forget_deleted(self, uid: str) -> None:
        """Stop reporting a deleted pod."""
        if self._watch is not None:
            self._watch.forget_deleted(uid)

    async def aclose(self) -> None:
        """Stop the watch and close the kubelet connections."""
        if self._watch is not None:
            self._watch.stop()
        if self._kubelet is not None:
            await self._kubelet.aclose()
