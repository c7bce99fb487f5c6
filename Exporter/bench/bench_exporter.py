"""Exporter benchmark: /metrics latency and memory with 8 GPUs, 16 MIG instances, 256 containers.

Runs the Runtime simulator (node-8gpu-16mig.yaml), allocates 256 containers
through the RuntimeClient (240 TDM slices on GPUs 0-4, the 16 MIG instances
whole), serves their 128 pods on a loopback kubelet `/pods`, starts
`lj-exporter` and scrapes /metrics as Prometheus does (OpenMetrics, gzip):
first with the default 15 s collection interval and the scrapes spread over a
minute (the shipped configuration: `scrape_*`), then collecting every second
with the scrapes back to back, so many land on a collection (`stress_scrape_*`).
Then the API server cost of the fallback (`apiserver_*`): a control plane of its
own (etcd and kube-apiserver, auditing pod requests as they arrive), the 128
pods bound to NODES nodes, one exporter per node with its kubelet port closed;
after every exporter has listed its pods, the pod requests the API server
receives over a window (longer than the five minutes a watch lasts) are counted.
Writes a flat JSON object (bench/README.md) and prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeClient
from lj_runtimekit.runtimesim.process import SimulatorProcess
from lj_runtimekit.testkit.podserver import PodListServer
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.procfs import status_mb

HERE = Path(__file__).resolve().parent
NODE = HERE / "node-8gpu-16mig.yaml"
PODS = 128
CONTAINERS_PER_POD = 2
TDM_CONTAINERS_PER_GPU = 48
SLICE_PERCENT = 2
WARMUP = 20
NODES = 4
"""Nodes (one exporter each) of the API server measurement."""
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [ResponseStarted, ResponseComplete, Panic]
rules:
  - level: Metadata
    resources: [{group: "", resources: [pods]}]
  - level: None
"""
# The Accept header of a Prometheus 2.x scrape.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _plan(devices: list[pb.Device]) -> list[tuple[str, str, DeviceShare]]:
    """(pod, container, share) for 256 containers: TDM slices first, then MIG instances."""
    targets: list[DeviceShare] = []
    for device in devices:
        if device.mode == pb.DEVICE_MODE_TDM:
            targets += [
                DeviceShare(device.id, SLICE_PERCENT, SLICE_PERCENT)
                for _ in range(TDM_CONTAINERS_PER_GPU)
            ]
    targets += [DeviceShare(i.id) for d in devices for i in d.mig_instances]
    total = PODS * CONTAINERS_PER_POD
    if len(targets) != total:
        raise SystemExit(
            f"node {NODE} gives {len(targets)} placements, the benchmark needs {total}"
        )
    return [
        (f"pod-{n // CONTAINERS_PER_POD:03d}", f"c{n % CONTAINERS_PER_POD}", share)
        for n, share in enumerate(targets)
    ]


async def _allocate(socket_dir: Path) -> list[tuple[str, str, DeviceShare]]:
    async with RuntimeClient(socket_dir) as client:
        plan = _plan(await client.list_devices())
        for pod, container, share in plan:
            await client.allocate(
                pb.AllocateRequest(
                    container_key=f"uid-{pod}/{container}",
                    pod_namespace="bench",
                    pod_name=pod,
                    pod_uid=f"uid-{pod}",
                    container_name=container,
                    devices=[
                        pb.DeviceRequest(
                            device_id=share.device_id,
                            core_percent=share.core_percent,
                            memory_percent=share.memory_percent,
                        )
                    ],
                )
            )
        return plan


def _pods(plan: list[tuple[str, str, DeviceShare]]) -> list[dict[str, Any]]:
    key = load_protocol().annotations.allocated_devices
    pods: dict[str, dict[str, tuple[DeviceShare, ...]]] = {}
    for pod, container, share in plan:
        pods.setdefault(pod, {})[container] = (share,)
    return [
        {
            "metadata": {
                "uid": f"uid-{pod}",
                "namespace": "bench",
                "name": pod,
                "annotations": {key: encode_assignment(assignment)},
            },
            "spec": {"nodeName": "bench-node", "containers": [{"name": c} for c in assignment]},
            "status": {"phase": "Running"},
        }
        for pod, assignment in pods.items()
    ]


def _get(url: str, gzip_ok: bool) -> bytes:
    """GET as Prometheus does (OpenMetrics preferred, gzip), or plain text without gzip."""
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"} if gzip_ok else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (loopback http URL)
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        body: bytes = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body


def _wait_ready(url: str, containers: int, proc: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"lj-exporter exited with {proc.returncode}:\n{log.read_text()}")
        try:
            text = _get(url, gzip_ok=False).decode()
        except OSError:
            text = ""
        if text.count("lj_runtimekit_container_utilization_ratio{") == containers:
            return text
        time.sleep(0.2)
    raise SystemExit(
        f"lj-exporter did not report {containers} containers in 60 s:\n{log.read_text()}"
    )


def _scrape_ms(url: str, count: int, pace_s: float = 0.0) -> list[float]:
    """Scrape `count` times as Prometheus does, `pace_s` apart (0: back to back)."""
    times = []
    next_at = time.perf_counter()
    for i in range(count + WARMUP):
        if pace_s:
            time.sleep(max(0.0, next_at - time.perf_counter()))
            next_at += pace_s
        started = time.perf_counter()
        _get(url, gzip_ok=True)
        if i >= WARMUP:
            times.append((time.perf_counter() - started) * 1000)
    return times


@contextlib.contextmanager
def _exporter(
    socket_dir: Path,
    pods_url: str,
    interval_s: float,
    log: Path,
    node: str = "bench-node",
    kubeconfig: Path | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    fallback = ["--kubeconfig", str(kubeconfig)] if kubeconfig else ["--apiserver-fallback", "off"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit.exporter.cmd.exporter.main",
                "--listen-address",
                "127.0.0.1",
                "--port",
                str(port),
                "--node-name",
                node,
                "--runtime-socket-dir",
                str(socket_dir),
                "--kubelet-pods-url",
                pods_url,
                "--collection-interval",
                str(interval_s),
                *fallback,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc, f"http://127.0.0.1:{port}/metrics"
        finally:
            proc.terminate()
            proc.wait(20)


def _stats(prefix: str, times: list[float]) -> dict[str, float]:
    return {
        f"{prefix}p50_ms": round(statistics.median(times), 3),
        f"{prefix}p99_ms": round(_percentile(times, 0.99), 3),
        f"{prefix}max_ms": round(max(times), 3),
    }


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _buckets(text: str) -> dict[float, float]:
    """The exporter's own scrape-duration histogram: upper bound (s) -> cumulative count."""
    out = {}
    pattern = r'^lj_runtimekit_exporter_scrape_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$'
    for le, count in re.findall(pattern, text, re.MULTILINE):
        out[float(le)] = float(count)
    return out


def _server_p99_ms(before: str, after: str) -> float:
    """Upper bound of the bucket holding the 99th percentile of the scrapes in between."""
    b, a = _buckets(before), _buckets(after)
    total = a[float("inf")] - b.get(float("inf"), 0.0)
    for le in sorted(a):
        if a[le] - b.get(le, 0.0) >= 0.99 * total:
            return le * 1000
    return float("inf")


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def _node_requests(audit_log: Path, after_s: float) -> list[dict[str, Any]]:
    """Audited pod requests received after `after_s` (Unix time) that select one bench node."""
    found = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        uri = event.get("requestURI", "")
        if "spec.nodeName%3Dbench-node-" not in uri:
            continue
        received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
        if received >= after_s:
            found.append(event)
    return found


def _apiserver_requests(
    socket_dir: Path, pod_objects: list[dict[str, Any]], work: Path, window_s: float
) -> dict[str, float]:
    """Pod requests per minute and node the API server receives from fallback exporters."""
    audit_log = work / "audit.log"
    (work / "audit-policy.yaml").write_text(AUDIT_POLICY)
    config = ControlPlaneConfig(
        controller_manager=False,
        scheduler=False,
        kwok=False,
        extra_apiserver_args=[
            f"--audit-policy-file={work / 'audit-policy.yaml'}",
            f"--audit-log-path={audit_log}",
            "--audit-log-format=json",
        ],
    )
    closed = f"http://127.0.0.1:{free_port()}/pods"  # nothing listens: the fallback reads
    with ControlPlane(config) as cp, contextlib.ExitStack() as stack:
        kube = KubeClient.connect(str(cp.kubeconfig_path))
        kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "bench"}})
        # No controller manager here to create it; pod admission needs it.
        kube.request(
            "POST",
            "/api/v1/namespaces/bench/serviceaccounts",
            body={"metadata": {"name": "default"}},
        )
        for n, pod in enumerate(pod_objects):
            body = json.loads(json.dumps(pod))
            del body["metadata"]["uid"], body["status"]
            body["spec"]["nodeName"] = f"bench-node-{n % NODES}"
            for container in body["spec"]["containers"]:
                container["image"] = "registry.example/bench:1"
            kube.request("POST", "/api/v1/namespaces/bench/pods", body=body)
        kube.close()
        procs = []
        for i in range(NODES):
            log = work / f"apiserver-{i}.log"
            procs.append(
                stack.enter_context(
                    _exporter(socket_dir, closed, 15, log, f"bench-node-{i}", cp.kubeconfig_path)
                )
            )
        per_node = len(pod_objects) // NODES
        deadline = time.monotonic() + 120
        for i, (proc, url) in enumerate(procs):
            name = rf'lj_runtimekit_exporter_pods\{{node="bench-node-{i}",source="apiserver"\}}'
            while True:
                with contextlib.suppress(OSError):  # not serving yet
                    if _metric(_get(url, gzip_ok=False).decode(), name) == per_node:
                        break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"bench-node-{i}: its {per_node} pods not listed in 120 s")
                time.sleep(0.5)
        startup = len(_node_requests(audit_log, 0.0))
        started = time.time()
        time.sleep(window_s)
        steady = _node_requests(audit_log, started)
        rss = [status_mb(proc.pid) for proc, _ in procs]
    verbs: dict[str, int] = {}
    for event in steady:
        verbs[event["verb"]] = verbs.get(event["verb"], 0) + 1
    return {
        "apiserver_requests_per_min_per_node": round(len(steady) / (window_s / 60) / NODES, 3),
        "apiserver_lists_in_window": verbs.get("list", 0),
        "apiserver_watches_in_window": verbs.get("watch", 0),
        "apiserver_startup_requests_per_node": round(startup / NODES, 2),
        "apiserver_window_s": window_s,
        "apiserver_nodes": NODES,
        "apiserver_fallback_rss_mb": round(max(rss), 1),
    }


def main() -> int:
    """Run the benchmark and write the JSON part."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--scrapes", type=int, default=500, help="scrapes measured per run")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds the paced run spreads its scrapes"
    )
    parser.add_argument(
        "--apiserver-window",
        type=float,
        default=330.0,
        help="seconds the API server requests of the fallback are counted (0: skip)",
    )
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="ljb", dir="/tmp"))
    with SimulatorProcess(work / "s", NODE) as sim:
        plan = asyncio.run(_allocate(sim.socket_dir))
        kubelet = PodListServer(_pods(plan)).start()
        pods_url = kubelet.url
        try:
            # 1. The shipped configuration: collections every 15 s, scrapes spread over a minute.
            with _exporter(sim.socket_dir, pods_url, 15, work / "default.log") as (proc, url):
                text = _wait_ready(url, len(plan), proc, work / "default.log")
                before, cpu_before = _get(url, gzip_ok=False).decode(), _cpu_s(proc.pid)
                paced = _scrape_ms(url, args.scrapes, pace_s=args.duration / args.scrapes)
                cpu = _cpu_s(proc.pid) - cpu_before
                after = _get(url, gzip_ok=False).decode()
                rss, peak = status_mb(proc.pid), status_mb(proc.pid, "VmHWM")
            # 2. Stress: a collection every second, scrapes back to back (many land on one).
            with _exporter(sim.socket_dir, pods_url, 1, work / "stress.log") as (proc, url):
                _wait_ready(url, len(plan), proc, work / "stress.log")
                stress = _scrape_ms(url, args.scrapes)
                stress_rss = status_mb(proc.pid)
                final = _get(url, gzip_ok=False).decode()
        finally:
            kubelet.stop()
        apiserver = (
            _apiserver_requests(sim.socket_dir, _pods(plan), work, args.apiserver_window)
            if args.apiserver_window
            else {}
        )

    collections = _metric(final, "lj_runtimekit_exporter_collection_duration_seconds_count")
    collection_sum = _metric(final, "lj_runtimekit_exporter_collection_duration_seconds_sum")
    result = {
        **_stats("scrape_", paced),
        **_stats("stress_scrape_", stress),
        # Less sensitive to a busy machine than the client's clock: the exporter's own view.
        "scrape_server_p99_bucket_ms": _server_p99_ms(before, after),
        "scrape_server_mean_ms": round(
            (
                _metric(after, "lj_runtimekit_exporter_scrape_duration_seconds_sum")
                - _metric(before, "lj_runtimekit_exporter_scrape_duration_seconds_sum")
            )
            / (
                _metric(after, "lj_runtimekit_exporter_scrape_duration_seconds_count")
                - _metric(before, "lj_runtimekit_exporter_scrape_duration_seconds_count")
            )
            * 1000,
            3,
        ),
        "scrape_cpu_ms": round(cpu / (args.scrapes + WARMUP) * 1000, 3),
        "rss_mb": round(rss, 1),
        "rss_peak_mb": round(peak, 1),
        "stress_rss_mb": round(stress_rss, 1),
        "collection_mean_ms": round(collection_sum / collections * 1000, 3),
        "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
        "metrics_bytes": len(text.encode()),
        "containers": len(plan),
        "scrapes": args.scrapes,
        **apiserver,
        "host_load_1m": round(max(load_before, os.getloadavg()[0]), 2),
        "host_cpus": os.cpu_count() or 0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    for key, value in result.items():
        print(f"exporter.{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
