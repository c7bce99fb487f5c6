"""Extender mode: device-level placement for clusters that keep the stock kube-scheduler.

HTTP verbs of the extender protocol (k8s.io/kube-scheduler/extender/v1):
POST {prefix}/filter, {prefix}/prioritize, {prefix}/bind with JSON bodies whose
keys are Go field names; keys are matched case-insensitively. Filter answers
with NodeNames when the scheduler is nodeCacheCapable (it sent NodeNames) or
with Nodes otherwise; Prioritize scores 0..10; Bind chooses the devices on the
node the scheduler picked, after running the profile's filters on it (a node
the pod's Filter rejects is refused, never bound), and writes the Binding with
the assignment annotations (one write). Gang members are refused: the
kube-scheduler binds one pod at a time, so all-or-nothing placement needs the
lj-scheduler profile. Malformed JSON: HTTP 400 naming the problem.

The verbs bind pods, so the server listens on loopback only, unless it serves
TLS and authenticates its caller (a bearer token, or a client certificate
signed by a given CA); `security_problem` says why a setup is refused.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import ssl
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lj_runtimekit.proto.pkg.kube import KubeError
from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    KubeObject,
    PodInfo,
    parse_pod,
)
from lj_runtimekit.schedulerframework.internal.framework.runtime import Framework
from lj_runtimekit.schedulerframework.internal.framework.types import (
    Code,
    CycleState,
    PreFilterResult,
    Status,
    unresolvable,
    unschedulable,
)
from lj_runtimekit.schedulerframework.internal.plugins import (
    nodeaffinity,
    noderesources,
    tainttoleration,
)
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling.plugin import gang_key
from lj_runtimekit.schedulerframework.internal.plugins.dynamicresources import (
    CLAIMS_ALLOCATED_ELSEWHERE,
)
from lj_runtimekit.schedulerframework.internal.scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)
MAX_EXTENDER_PRIORITY = 10


class BadRequest(ValueError):
    """A request body the extender cannot use; answered with HTTP 400."""


def field(data: Mapping[str, Any], name: str) -> Any:
    """A key read case-insensitively (Go field names, or lowerCamel from other clients)."""
    if name in data:
        return data[name]
    lowered = name.lower()
    for key, value in data.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


STOCK_SCORED = (noderesources.NAME, nodeaffinity.NAME, tainttoleration.NAME)
"""Score plugins the kube-scheduler in front of the extender runs itself: prioritize leaves
them out, or resource fit, preferred affinity and soft taints would count twice."""

GANG_REFUSED = (
    "gangs need lj-scheduler profile, extender mode cannot place all-or-nothing: pod {pod} "
    "belongs to gang {gang}; set its schedulerName to an lj-scheduler profile"
)


class Extender:
    """The extender verbs over a Scheduler's cache and first (or named) profile."""

    def __init__(self, scheduler: Scheduler, profile: str | None = None) -> None:
        self.scheduler = scheduler
        name = profile or next(iter(scheduler.frameworks))
        self.framework: Framework = scheduler.frameworks[name]
        self._pods: OrderedDict[str, KubeObject] = OrderedDict()
        self._lock = threading.Lock()

    def _remember(self, obj: KubeObject) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        with self._lock:
            self._pods[uid] = obj
            self._pods.move_to_end(uid)
            while len(self._pods) > 5000:
                self._pods.popitem(last=False)

    @staticmethod
    def _pod(body: Mapping[str, Any]) -> tuple[KubeObject, PodInfo]:
        obj = field(body, "Pod")
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise BadRequest("Pod: missing, or not a Pod object with metadata")
        return obj, parse_pod(obj)

    @staticmethod
    def _node_names(body: Mapping[str, Any]) -> tuple[list[str], list[KubeObject] | None]:
        names = field(body, "NodeNames")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadRequest("NodeNames: must be a list of strings")
            return names, None
        nodes = field(body, "Nodes")
        if nodes is None:
            raise BadRequest("neither NodeNames nor Nodes given")
        items = field(nodes, "Items") if isinstance(nodes, dict) else None
        if not isinstance(items, list):
            raise BadRequest("Nodes: must be a NodeList with items")
        out = [str((n.get("metadata") or {}).get("name", "")) for n in items if isinstance(n, dict)]
        return out, [n for n in items if isinstance(n, dict)]

    def _pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        """PreFilter, after the checks the extender adds: unparsable pods and gang members
        are unresolvable here."""
        if pod.parse_errors:
            return None, unresolvable(*pod.parse_errors)
        gang = gang_key(pod, self.scheduler.protocol.annotations.gang_group)
        if gang is not None:
            return None, unresolvable(GANG_REFUSED.format(pod=pod.key, gang=gang))
        state.write(CLAIMS_ALLOCATED_ELSEWHERE, True)  # the kube-scheduler allocates them
        return self.framework.run_pre_filter(state, pod)

    def filter(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj, pod = self._pod(body)
        names, nodes = self._node_names(body)
        self._remember(obj)
        fwk = self.framework
        state = CycleState()
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        passed: list[str] = []
        cache = self.scheduler.cache
        with cache.lock:
            pre, status = self._pre_filter(state, pod)
            if not status.ok:
                target = (
                    unresolvable if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE else failed
                )
                for n in names:
                    target[n] = status.message()
            else:
                for n in names:
                    node = cache.nodes.get(n)
                    if node is None or not node.present:
                        failed[n] = "node not (yet) known to the lj-scheduler extender"
                        continue
                    st = fwk.node_status(state, pod, pre, node)
                    if st.ok:
                        passed.append(n)
                    elif st.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                        unresolvable[n] = st.message()
                    else:
                        failed[n] = st.message()
        result: dict[str, Any] = {
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }
        if nodes is None:
            result["NodeNames"] = passed
        else:
            keep = set(passed)
            result["Nodes"] = {
                "metadata": {},
                "items": [n for n in nodes if (n.get("metadata") or {}).get("name") in keep],
            }
        return result

    def prioritize(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        obj, pod = self._pod(body)
        names, _ = self._node_names(body)
        self._remember(obj)
        fwk = self.framework
        state = CycleState()
        cache = self.scheduler.cache
        with cache.lock:
            _, status = self._pre_filter(state, pod)
            state.skip_score.update(STOCK_SCORED)
            nodes = [cache.nodes[n] for n in names if n in cache.nodes and cache.nodes[n].present]
            totals = fwk.run_score(state, pod, nodes) if status.ok and nodes else {}
        top = max(totals.values(), default=0)
        return [
            {
                "Host": n,
                "Score": (totals.get(n, 0) * MAX_EXTENDER_PRIORITY // top) if top > 0 else 0,
            }
            for n in names
        ]

    def bind(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = field(body, "PodName")
        namespace = field(body, "PodNamespace")
        uid = field(body, "PodUID")
        node = field(body, "Node")
        for key, value in (("PodName", name), ("PodNamespace", namespace), ("Node", node)):
            if not isinstance(value, str) or not value:
                raise BadRequest(f"{key}: missing or not a string")
        with self._lock:
            obj = self._pods.get(str(uid or ""))
        if obj is None:
            kube = self.scheduler.kube
            if kube is None:
                return {"Error": f"pod {namespace}/{name} unknown"}
            try:
                obj = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            except KubeError as exc:
                return {"Error": str(exc)}
        pod = parse_pod(obj)
        if uid and pod.uid != uid:
            return {"Error": f"pod {namespace}/{name} has uid {pod.uid}, not {uid}"}
        fwk = self.framework
        state = CycleState()
        cache = self.scheduler.cache
        node_name = str(node)
        with cache.lock:
            held = cache.pods.get(pod.uid)
            bound_to = pod.node_name or (held.node if held and not held.assumed else "")
            if bound_to:
                # a retried bind whose first Binding landed: binding again would give the
                # devices it holds to the next pod
                why = f"pod {pod.key} is bound to node {bound_to} already"
                log.warning("extender bind refused: %s", why)
                return {"Error": why}
            if held is not None:
                return {
                    "Error": f"pod {pod.key}: a Binding sent earlier got no answer yet; its "
                    "placement is held until the pod shows bound or the assumption expires"
                }
            pre, status = self._pre_filter(state, pod)
            target = cache.nodes.get(node_name)
            if status.ok:
                if target is None or not target.present:
                    status = unschedulable("node not (yet) known to the lj-scheduler extender")
                else:
                    status = fwk.node_status(state, pod, pre, target)
            if not status.ok:
                why = f"pod {pod.key} cannot be bound to node {node_name}: {status.message()}"
                log.warning("extender bind refused: %s", why)
                self.scheduler.event(pod, "Warning", "FailedScheduling", why)
                return {"Error": why}
            cache.assume_pod(pod, node_name)
            status = fwk.run_reserve(state, pod, node_name)
            if not status.ok:
                cache.forget_pod(pod.uid)
                return {"Error": f"node {node_name}: {status.message()}"}
        status = fwk.run_bind(state, pod, node_name)
        if not status.ok and status.outcome_unknown:
            self._await_outcome(state, pod, node_name)
            return {
                "Error": f"Binding of {pod.key} got no answer ({status.message()}); its devices "
                f"stay held until the pod shows bound or deleted, at most "
                f"{self.scheduler.assumed_expiry_s:g}s"
            }
        if not status.ok:
            self._forget(state, pod, node_name)
            return {"Error": status.message()}
        with self._lock:
            self._pods.pop(pod.uid, None)
        return {"Error": ""}

    def _forget(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        """Releases what bind assumed, unless the watch confirmed the pod bound meanwhile
        (another Binding of it landed): then the devices are the pod's own."""
        with self.scheduler.cache.lock:
            if self.scheduler.cache.is_assumed(pod.uid):
                self.framework.run_unreserve(state, pod, node_name)
                self.scheduler.cache.forget_pod(pod.uid)

    def _await_outcome(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        """A Binding without an answer may have been written: the pod stays assumed, its
        devices held, until the watch shows it bound (confirmed) or deleted, at most the
        scheduler's `assumed_expiry_s`; then the devices are released."""
        log.warning(
            "binding outcome unknown, placement held until the watch shows the pod",
            extra={"pod": pod.key, "node": node_name},
        )

        def expire() -> None:
            self._forget(state, pod, node_name)

        timer = threading.Timer(self.scheduler.assumed_expiry_s, expire)
        timer.daemon = True
        timer.start()


@dataclass(frozen=True)
class Security:
    """TLS and caller authentication of the extender server (flags `--extender-tls-*`)."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None
    """Callers must present a certificate signed by this CA."""
    token: str | None = None
    """Callers must send `Authorization: Bearer <token>`."""

    @property
    def tls(self) -> bool:
        return bool(self.cert and self.key)

    @property
    def authenticated(self) -> bool:
        return bool(self.client_ca or self.token)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def security_problem(address: str, security: Security) -> str | None:
    """Why the extender must not serve on `address` this way; None when it may."""
    if bool(security.cert) != bool(security.key):
        return "--extender-tls-cert and --extender-tls-key must be given together"
    if security.client_ca and not security.tls:
        return "--extender-client-ca needs TLS: give --extender-tls-cert and --extender-tls-key"
    if is_loopback(address) or (security.tls and security.authenticated):
        return None
    return (
        f"--extender-address={address} is not a loopback address: the extender binds pods, so "
        "serving it beyond this host needs TLS (--extender-tls-cert, --extender-tls-key) and an "
        "authenticated caller (--extender-client-ca or --extender-token-file)"
    )


def read_token(path: str) -> str:
    """The bearer token in `path` (surrounding whitespace dropped); ValueError naming the file."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--extender-token-file {path}: cannot read: {exc}") from exc
    if not token:
        raise ValueError(f"--extender-token-file {path}: the file is empty")
    return token


def make_handler(
    extender: Extender, prefix: str, token: str | None = None
) -> type[BaseHTTPRequestHandler]:
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    expected = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60

        def setup(self) -> None:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.settimeout(self.timeout)
                self.request.do_handshake()  # here, in the request's thread, not in accept()
            super().setup()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("extender request: %s", format % args)

        def _reply(self, code: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/healthz", "/readyz"):
                self._reply(200, {"status": "ok"})
            else:
                self._reply(404, {"Error": f"unknown path {self.path}"})

        def do_POST(self) -> None:
            verb = self.path[len(prefix) :].strip("/") if self.path.startswith(prefix) else ""
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length > 0 else b""
            if expected is not None and not hmac.compare_digest(
                (self.headers.get("Authorization") or "").encode(), expected
            ):
                self._reply(401, {"Error": "missing or wrong bearer token"})
                return
            handlers = {
                "filter": extender.filter,
                "prioritize": extender.prioritize,
                "bind": extender.bind,
            }
            fn = handlers.get(verb)
            if fn is None:
                self._reply(
                    404, {"Error": f"unknown verb {verb!r}; known: filter, prioritize, bind"}
                )
                return
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                self._reply(400, {"Error": f"request body is not valid JSON: {exc}"})
                return
            if not isinstance(body, dict):
                self._reply(400, {"Error": "request body must be a JSON object"})
                return
            try:
                self._reply(200, fn(body))
            except BadRequest as exc:
                self._reply(400, {"Error": str(exc)})
            except Exception as exc:
                log.exception("extender verb failed", extra={"verb": verb})
                self._reply(500, {"Error": f"{verb} failed: {exc}"})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: Any) -> None:
        # a refused TLS handshake (no or a wrong client certificate), a dropped connection
        log.info("extender connection from %s failed: %s", client_address, sys.exc_info()[1])


def serve(
    extender: Extender,
    address: str,
    port: int,
    prefix: str = "",
    security: Security | None = None,
) -> ThreadingHTTPServer:
    """Starts the extender HTTP(S) server in a thread; returns it (shutdown() to stop).
    ValueError naming the flag when `security_problem` refuses the setup or a certificate,
    key or CA cannot be loaded; OSError when the address cannot be used."""
    security = security or Security()
    problem = security_problem(address, security)
    if problem is not None:
        raise ValueError(problem)
    token = security.token
    server = _Server((address, port), make_handler(extender, prefix, token))
    if security.tls:
        assert security.cert is not None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            try:
                ctx.load_cert_chain(security.cert, security.key)
            except OSError as exc:  # ssl.SSLError too
                raise ValueError(
                    f"--extender-tls-cert {security.cert} / --extender-tls-key {security.key}: "
                    f"cannot load: {exc}"
                ) from exc
            if security.client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                try:
                    ctx.load_verify_locations(cafile=security.client_ca)
                except OSError as exc:
                    raise ValueError(
                        f"--extender-client-ca {security.client_ca}: cannot load: {exc}"
                    ) from exc
        except ValueError:
            server.server_close()
            raise
        server.socket = ctx.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    threading.Thread(target=server.serve_forever, name="extender-http", daemon=True).start()
    return server
