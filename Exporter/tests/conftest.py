"""Exporter test harness: a kubelet `/pods` endpoint on loopback, the Exporter as a
subprocess, scraping and waiting helpers. Real HTTP, real sockets, real processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeClient
from lj_runtimekit.testkit.podserver import PodListServer
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.waits import wait_for

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "exporter" / "grafana-dashboard.json"
PROTOCOL = load_protocol()


def short_dir(prefix: str = "lj") -> Path:
    """A temp dir with a short path (unix socket paths must stay under ~100 characters)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


PROBE_ERRORS = (OSError, AssertionError, KeyError)
"""What a probe of a process still starting may raise: waits retry on these."""


def require_tool(name: str) -> str:
    """Path of a command-line tool; skip without it, except under CI=true where it fails."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not installed (Debian package prometheus; make deps installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


# --- kubelet /pods --------------------------------------------------------------------


@dataclass
class PodSpec:
    """A pod as the kubelet reports it."""

    uid: str
    namespace: str
    name: str
    containers: tuple[str, ...]
    annotations: dict[str, str]
    phase: str = "Running"
    node: str = "node-a"
    labels: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The pod as a Kubernetes object."""
        return {
            "metadata": {
                "uid": self.uid,
                "namespace": self.namespace,
                "name": self.name,
                "annotations": self.annotations,
                "labels": self.labels,
            },
            "spec": {"nodeName": self.node, "containers": [{"name": c} for c in self.containers]},
            "status": {"phase": self.phase},
        }


def kubelet_pods(pods: Sequence[PodSpec] = ()) -> PodListServer:
    """A kubelet `/pods` endpoint on loopback serving `pods`, started."""
    return PodListServer(p.as_json() for p in pods).start()


@pytest.fixture
def kubelet() -> Iterator[PodListServer]:
    """A kubelet `/pods` endpoint, stopped after the test."""
    server = kubelet_pods()
    yield server
    server.stop()


# --- the Exporter subprocess ------------------------------------------------------------


class Scrape:
    """One parsed /metrics response."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = []
        self.families: set[str] = set()
        self.help: dict[str, str] = {}
        """Family name -> its HELP text."""
        for family in text_string_to_metric_families(text):
            self.families.add(family.name)
            self.help[family.name] = family.documentation
            for s in family.samples:
                self.samples.append((s.name, dict(s.labels), s.value))

    def select(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        """Samples named `name` whose labels include `labels`."""
        return [
            (lab, value)
            for n, lab, value in self.samples
            if n == name and all(lab.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The one sample named `name` with `labels`; fails unless exactly one matches."""
        found = self.select(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples: {found[:3]}"
        return found[0][1]

    def names(self) -> set[str]:
        """Every sample name."""
        return {n for n, _, _ in self.samples}


class ExporterProcess:
    """`lj-exporter` as a subprocess on a free port; its log goes to a file."""

    def __init__(self, args: Sequence[str], log_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"exporter-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit.exporter.cmd.exporter.main",
                "--listen-address",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--node-name",
                "node-a",
                "--log-format",
                "json",
                "--apiserver-fallback",
                "off",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._serving, 60, "the exporter to serve /healthz", ignore=PROBE_ERRORS)

    def _serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"exporter exited with {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(self.base + "/healthz", timeout=2):
                return True
        except urllib.error.HTTPError as exc:
            exc.close()
            return True
        except OSError:
            return False

    def log(self) -> str:
        """The exporter's log so far."""
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
        """GET a path: (status, body, headers)."""
        request = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read(), response.headers
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read(), exc.headers

    def scrape(self) -> Scrape:
        """GET /metrics and parse it."""
        status, body, _ = self.get("/metrics")
        assert status == 200, body
        return Scrape(body.decode())

    def wait_scrape(
        self, what: str, accept: Callable[[Scrape], bool], timeout: float = 30.0
    ) -> Scrape:
        """Scrape until `accept` holds."""

        def probe() -> Scrape | None:
            scrape = self.scrape()
            return scrape if accept(scrape) else None

        return wait_for(probe, timeout, what, ignore=PROBE_ERRORS)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 10 s; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def run_exporter_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run `lj-exporter` to completion (for flag errors), with extra environment `env`."""
    return subprocess.run(
        [sys.executable, "-m", "lj_runtimekit.exporter.cmd.exporter.main", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- allocating through the Runtime ---------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One container's share of one device, as the test allocates it."""

    pod: PodSpec
    container: str
    share: DeviceShare


def allocate(socket_dir: Path, grants: Sequence[Grant]) -> list[pb.Device]:
    """Allocate every grant through the RuntimeClient; return the inventory."""

    async def go() -> list[pb.Device]:
        async with RuntimeClient(socket_dir) as client:
            for g in grants:
                await client.allocate(
                    pb.AllocateRequest(
                        container_key=f"{g.pod.uid}/{g.container}",
                        pod_namespace=g.pod.namespace,
                        pod_name=g.pod.name,
                        pod_uid=g.pod.uid,
                        container_name=g.container,
                        devices=[
                            pb.DeviceRequest(
                                device_id=g.share.device_id,
                                core_percent=g.share.core_percent,
                                memory_percent=g.share.memory_percent,
                            )
                        ],
                    )
                )
            return await client.list_devices()

    return asyncio.run(go())


def annotate(grants: Sequence[Grant], key: str) -> None:
    """Write each pod's assignment annotation `key` from the grants."""
    by_pod: dict[str, dict[str, list[DeviceShare]]] = {}
    pods: dict[str, PodSpec] = {}
    for g in grants:
        pods[g.pod.uid] = g.pod
        by_pod.setdefault(g.pod.uid, {}).setdefault(g.container, []).append(g.share)
    for uid, assignment in by_pod.items():
        pods[uid].annotations[key] = encode_assignment({c: tuple(s) for c, s in assignment.items()})


def runtime_samples(
    socket_dir: Path,
) -> tuple[pb.GetDeviceMetricsResponse, pb.GetContainerMetricsResponse]:
    """One device sample then the container samples, as the Exporter takes them."""

    async def go() -> tuple[pb.GetDeviceMetricsResponse, pb.GetContainerMetricsResponse]:
        async with RuntimeClient(socket_dir) as client:
            devices = await client.device_metrics()
            containers = await client.container_metrics()
            return devices, containers

    return asyncio.run(go())


class Harness:
    """The helpers above, given to test modules as the `lj` fixture (conftest is not importable)."""

    PodSpec = PodSpec
    Grant = Grant
    Scrape = Scrape
    ExporterProcess = ExporterProcess
    DeviceShare = DeviceShare
    PROTOCOL = PROTOCOL
    PROBE_ERRORS = PROBE_ERRORS
    DASHBOARD = DASHBOARD
    REPO = REPO
    short_dir = staticmethod(short_dir)
    kubelet_pods = staticmethod(kubelet_pods)
    free_port = staticmethod(free_port)
    wait_for = staticmethod(wait_for)
    require_tool = staticmethod(require_tool)
    run_exporter_cli = staticmethod(run_exporter_cli)
    allocate = staticmethod(allocate)
    annotate = staticmethod(annotate)
    runtime_samples = staticmethod(runtime_samples)


@pytest.fixture(scope="session")
def lj() -> type[Harness]:
    """The Exporter test helpers."""
    return Harness
