"""The kubelet read-only port's `/pods`: a PodList of the node, over real HTTP on loopback."""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import sys
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PodObject = dict[str, Any]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Like the kubelet's Go server: no Nagle, and the answer leaves in one write
    # (headers and body in separate segments wait on the peer's delayed ACK).
    disable_nagle_algorithm = True
    wbufsize = 1 << 22

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/pods":
            self.send_error(404, "only /pods is served")
            return
        body = self.server.owner.body()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    allow_reuse_address = True

    def __init__(self, owner: PodListServer, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        with self._conn_lock:
            self.connections.add(conn)
        return conn, addr

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a reader stopped or restarted) is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """Close kept-alive client connections (a stopped kubelet answers nothing)."""
        with self._conn_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class PodListServer:
    """Serves `GET /pods` with the pods it holds; pods can be added, changed and removed live."""

    def __init__(self, pods: Iterable[Mapping[str, Any]] = (), *, port: int = 0) -> None:
        self.port = port
        """Loopback port to listen on (0: a free one, chosen at start)."""
        self._lock = threading.Lock()
        self._pods: dict[str, PodObject] = {}
        self._body: bytes | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.requests = 0
        for pod in pods:
            self.put(pod)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>/pods`."""
        if self._server is None:
            raise RuntimeError("pod list server not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}/pods"

    def start(self) -> PodListServer:
        """Listen on a free loopback port."""
        self._server = _Server(self, self.port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kubelet-pods", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.close_connections()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> PodListServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def put(self, pod: Mapping[str, Any]) -> None:
        """Add or replace a pod (keyed by its UID)."""
        with self._lock:
            self._pods[str(pod["metadata"]["uid"])] = copy.deepcopy(dict(pod))
            self._body = None

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Serve exactly these pods from now on."""
        fresh = {str(p["metadata"]["uid"]): copy.deepcopy(dict(p)) for p in pods}
        with self._lock:
            self._pods = fresh
            self._body = None

    def remove(self, uid: str) -> None:
        """Remove a pod."""
        with self._lock:
            self._pods.pop(uid, None)
            self._body = None

    def get(self, uid: str) -> PodObject:
        """A copy of a pod."""
        with self._lock:
            return copy.deepcopy(self._pods[uid])

    def pods(self) -> list[PodObject]:
        """Copies of every pod."""
        with self._lock:
            return copy.deepcopy(list(self._pods.values()))

    def body(self) -> bytes:
        """The PodList JSON as served."""
        with self._lock:
            self.requests += 1
            if self._body is None:
                self._body = json.dumps(
                    {
                        "kind": "PodList",
                        "apiVersion": "v1",
                        "metadata": {},
                        "items": list(self._pods.values()),
                    }
                ).encode()
            return self._body


def pod_object(
    name: str,
    containers: Mapping[str, Mapping[str, int]],
    *,
    namespace: str = "default",
    uid: str | None = None,
    node_name: str = "",
    annotations: Mapping[str, str] | None = None,
    phase: str = "Pending",
    creation: str = "2026-01-01T00:00:00Z",
    init_containers: Mapping[str, Mapping[str, int]] | None = None,
) -> PodObject:
    """A pod object as the kubelet lists it: container name -> extended resource limits."""

    def spec_of(items: Mapping[str, Mapping[str, int]]) -> list[PodObject]:
        return [
            {
                "name": cname,
                "image": "busybox",
                "resources": {
                    "limits": {k: str(v) for k, v in limits.items()},
                    "requests": {k: str(v) for k, v in limits.items()},
                },
            }
            for cname, limits in items.items()
        ]

    spec: PodObject = {
        "nodeName": node_name,
        "runtimeClassName": "lj-runtime",
        "containers": spec_of(containers),
    }
    if init_containers:
        spec["initContainers"] = spec_of(init_containers)
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "creationTimestamp": creation,
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }
