"""Controller test and bench helpers: the Controller as a subprocess, a cuttable TCP proxy,
node and Job probes. Used by the Controller's control-plane tests and benchmarks and by the
deploy tests."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from lj_runtimekit.testkit.procfs import status_mb

STATE = "lj-runtimekit.io/feature-state"
JOB_ANNOTATION = "lj-runtimekit.io/feature-job"
MESSAGE = "lj-runtimekit.io/feature-message"
ATTEMPTS = "lj-runtimekit.io/feature-attempts"
RETRY_AT = "lj-runtimekit.io/feature-retry-at"
JOB_SELECTOR = "app.kubernetes.io/managed-by=lj-runtimekit-controller"
GROUP_LABEL = "envtest.lj-runtimekit.io/group"
TEST_IMAGE = "registry.invalid/lj-runtimekit/job-agent:test"


class OperatorProcess:
    """`lj-controller` run as a subprocess (python -m), logging to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        *extra: str,
        node_selector: str | None = None,
    ) -> None:
        self.log_path = log_path
        self.argv = [
            sys.executable,
            "-m",
            "lj_runtimekit.controller.cmd.controller.main",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--job-image={TEST_IMAGE}",
            "--job-service-account=default",
            f"--node-selector={node_selector if node_selector is not None else ''}",
            "--health-port=0",
            "--log-format=text",
            "--log-level=INFO",
            "--lease-duration=6",
            "--lease-renew-deadline=4",
            "--lease-retry-period=1",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self.starts = 0

    def start(self) -> OperatorProcess:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT)
        self.starts += 1
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
        """Signal the process and wait; SIGKILL if it does not exit."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def peak_rss_mb(self) -> float:
        """Peak resident set size (VmHWM) of the running process."""
        return self._status_mb("VmHWM")

    def rss_mb(self) -> float:
        """Resident set size now (VmRSS) of the running process."""
        return self._status_mb("VmRSS")

    def _status_mb(self, key: str) -> float:
        assert self.proc is not None
        return status_mb(self.proc.pid, key)


StartOperator = Callable[..., OperatorProcess]


class TcpProxy:
    """A TCP proxy in front of the API server that a test can cut.

    - `kill()` closes the listener and every connection (a dropped watch);
      `start()` listens again on the same port.
    - `freeze()` silently stops forwarding on the connections open now while new
      connections still work: the "silent dead stream" of a lost NAT/LB entry.
    """

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._frozen: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.accepted = 0

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="tcp-proxy", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        assert self._listener is not None
        self._listener.setblocking(False)
        sel.register(self._listener, selectors.EVENT_READ, None)
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.1):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        client, _ = self._listener.accept()
                        upstream = socket.create_connection(self.target)
                        client.setblocking(False)
                        upstream.setblocking(False)
                        with self._lock:
                            self._pairs.append((client, upstream))
                        self.accepted += 1
                        sel.register(client, selectors.EVENT_READ, upstream)
                        sel.register(upstream, selectors.EVENT_READ, client)
                    continue
                src: socket.socket = key.fileobj  # type: ignore[assignment]
                dst: socket.socket = key.data
                if src in self._frozen:
                    with contextlib.suppress(OSError):
                        src.recv(65536)  # swallow: nothing gets through any more
                    continue
                try:
                    data = src.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._close_pair(sel, src, dst)
                    continue
                try:
                    dst.setblocking(True)
                    dst.sendall(data)
                    dst.setblocking(False)
                except OSError:
                    self._close_pair(sel, src, dst)
        for sock in list(sel.get_map().values()):
            with contextlib.suppress(Exception):
                sel.unregister(sock.fileobj)
        sel.close()

    def _close_pair(self, sel: selectors.BaseSelector, a: socket.socket, b: socket.socket) -> None:
        for s in (a, b):
            with contextlib.suppress(Exception):
                sel.unregister(s)
            with contextlib.suppress(OSError):
                s.close()
            self._frozen.discard(s)

    def freeze(self) -> int:
        """Blackhole every open connection; return how many."""
        with self._lock:
            for client, upstream in self._pairs:
                if client.fileno() != -1:
                    self._frozen.update((client, upstream))
            return len(self._frozen) // 2

    def kill(self) -> None:
        """Close the listener and all connections (RST where possible)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            for client, upstream in self._pairs:
                for s in (client, upstream):
                    with contextlib.suppress(OSError):
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                    with contextlib.suppress(OSError):
                        s.close()
            self._pairs.clear()
            self._frozen.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def kubeconfig_via(source: Path, target: Path, port: int) -> Path:
    """A copy of `source` whose server is https://127.0.0.1:<port>."""
    doc = yaml.safe_load(source.read_text())
    for cluster in doc["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    target.write_text(yaml.safe_dump(doc))
    target.chmod(0o600)
    return target


class Cluster:
    """Probes of nodes, Jobs and events for one test namespace."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.core = k8s.CoreV1Api(api)
        self.batch = k8s.BatchV1Api(api)
        self.namespace = namespace

    def node(self, name: str) -> Any:
        return self.core.read_node(name)

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.node(name).metadata.annotations or {})

    def state(self, name: str) -> str | None:
        return self.annotations(name).get(STATE)

    def label(self, name: str, key: str, value: str | None) -> None:
        self.core.patch_node(name, {"metadata": {"labels": {key: value}}})

    def jobs(self) -> list[Any]:
        return list(self.batch.list_namespaced_job(self.namespace).items)

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace).items)

    def events(self, node: str) -> list[Any]:
        items = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}"
        ).items
        items = [e for e in items if e.reporting_component == "lj-runtimekit-controller"]
        return sorted(items, key=lambda e: (e.metadata.creation_timestamp, e.metadata.name))

    def reasons(self, node: str) -> list[str]:
        return [e.reason for e in self.events(node)]

    def describe(self) -> str:
        jobs = [
            (j.metadata.name, j.metadata.labels.get("lj-runtimekit.io/node"), j.status.conditions)
            for j in self.jobs()
        ]
        pods = [
            (
                p.metadata.name,
                p.spec.node_name,
                p.status.phase,
                [(c.type, c.status, c.reason, c.message) for c in p.status.conditions or []],
            )
            for p in self.pods()
        ]
        return f"jobs={jobs} pods={pods}"


class JobWatch:
    """Counts Job creations per node in a namespace, and the most Jobs one node ever had
    at the same time (both must stay at one)."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.batch = k8s.BatchV1Api(api)
        self.namespace = namespace
        self.created: dict[str, set[str]] = {}
        self.live: dict[str, set[str]] = {}
        self.max_concurrent = 0
        # uid -> node, and monotonic times: Job seen, seen Complete, seen gone
        self.node_of: dict[str, str] = {}
        self.added_at: dict[str, float] = {}
        self.complete_at: dict[str, float] = {}
        self.deleted_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-watch", daemon=True)
        self._ready = threading.Event()

    def __enter__(self) -> JobWatch:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        from kubernetes import watch

        listed = self.batch.list_namespaced_job(self.namespace)
        rv = listed.metadata.resource_version
        self._ready.set()
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    self.batch.list_namespaced_job,
                    self.namespace,
                    resource_version=rv,
                    timeout_seconds=5,
                    allow_watch_bookmarks=True,
                ):
                    obj = event["object"]
                    rv = obj.metadata.resource_version
                    if event["type"] == "BOOKMARK":
                        continue
                    node = (obj.metadata.annotations or {}).get("lj-runtimekit.io/node", "?")
                    uid = obj.metadata.uid
                    now = time.monotonic()
                    self.node_of[uid] = node
                    self.added_at.setdefault(uid, now)
                    conditions = (obj.status and obj.status.conditions) or []
                    if any(c.type == "Complete" and c.status == "True" for c in conditions):
                        self.complete_at.setdefault(uid, now)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.created.setdefault(node, set()).add(uid)
                        self.live.setdefault(node, set()).add(uid)
                    elif event["type"] == "DELETED":
                        self.live.setdefault(node, set()).discard(uid)
                        self.deleted_at.setdefault(uid, now)
                    self.max_concurrent = max(self.max_concurrent, len(self.live.get(node, ())))
                    if self._stop.is_set():
                        break
            except Exception:  # a watch hiccup: re-list from the last version
                time.sleep(0.2)
            finally:
                w.stop()

    def total_created(self) -> int:
        return sum(len(v) for v in self.created.values())


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def iter_lines(path: Path) -> Iterator[str]:
    yield from path.read_text(errors="replace").splitlines()
