"""Scheduler benchmark: lj-scheduler against the stock kube-scheduler, side by side.

One control plane (etcd, kube-apiserver, KWOK; no default scheduler), 1000
KWOK nodes x 8 GPUs. Every run starts from an empty namespace with its pods
created before the scheduler starts. KWOK plays no kubelet for pods here (only
its pod-delete stage: a bound pod stays Pending, as in upstream's
scheduler_perf): on these two shared cores it wrote each pod's Running status
whenever it got CPU, which left those writes outside the window of a
scheduler that used more CPU and inside the window of one that used less.
KWOK runs at nice -5 (`prioritise_node_simulator`). A run's pods are deleted
after it, and the next run waits until KWOK's own DELETE requests for them
have stopped.

1. whole-GPU rounds (`--rounds`, default 11): in each round the stock
   kube-scheduler (pinned version, profile `bench-kube`) and lj-scheduler
   each place N whole-GPU pods, both with client QPS/burst 5000/10000; the
   order alternates between rounds so neither always runs on a warmer API
   server. Each round gives one ratio (ours / theirs, in the same minute);
   the reported rates and ratio are the medians over rounds, the per-round
   values are kept beside them, and each median ratio has a distribution-free
   interval (`median_interval`; its coverage is
   `whole_gpu_ratio_interval_coverage`, 0.93 with 11 rounds): a single round
   swings by about 20 % on these two cores. Each round also runs the kube-scheduler on
   matched work (`whole_gpu_ratio_matched_work`): its NodeResourcesFit
   scores MostAllocated on the GPU resource (binpack, as GpuShare does) and
   its percentageOfNodesToScore is the share of the nodes lj-scheduler
   scores for a whole-GPU pod (GpuShare's rankedNodesToScore over the node
   count; the kube-scheduler never scores fewer than 100 nodes), and its pods
   get a stand-in of the Device Plugin's record (a merge patch of the same size
   under keys no component reads), so that the API server does the same writes
   for both schedulers' pods. Beside our
   filter+score latencies stand the kube-scheduler's own
   `scheduler_scheduling_algorithm_duration_seconds` p50/p99, scraped from
   its /metrics;
2. warm open loop: both schedulers running and synced (a warm-up pod each
   bound), pods arrive at a fixed rate (`--open-loop-rate`, alternating
   between the two, the kube-scheduler on the matched profile) for
   `--open-loop-seconds`; create-to-bind p50/p99 per scheduler (from the
   intended arrival time to the bind seen by the watch);
3. lj-scheduler places N slice pods (core 25 % / memory 25 %);
4. gangs (bench_gang.py): a 256-pod gang on topology-labelled nodes
   (gang_256_place_s) and four competing gangs of which three fit
   (partial_gangs, gang_competing_whole).

Every pod names the `lj-runtime` RuntimeClass (created first). The machine's
load average is recorded at the start and at the end.

Throughput is (N-1) / (last bind - first bind), from a watch. The matched-work
comparison is also made to the last record (`whole_gpu_ratio_matched_work_to_records`:
(N-1) / (last record written - first bind)), where both runs have done the same
work for every pod: about half of the records, ours and the stand-ins alike, are
written after the last bind, and how many varies from run to run. After the last
bind a run waits for its Device Plugin records and its N Scheduled events
before the scheduler stops: the API server's CPU and requests per pod and the
scheduler's CPU per pod then hold all of a run's work (lj-scheduler's events
trail its binds; before, unwritten events were cut when the process stopped and
records landed in the next run's minute). The
filter+score latencies come from lj-scheduler's histogram
(`lj_scheduler_filter_score_duration_seconds`, interpolated within buckets)
of the round with the median rate. CPU per pod is the scheduler process's
user+system time (start-up included) over N; `rss_mb` is its peak resident memory
(VmHWM), the largest over the rounds, the kube-scheduler's beside it. The bind
window (first to last bind) is also accounted process by process (`window_cost`,
from /proc): each process's CPU ms per pod in it (the API server, the scheduler,
etcd, the controller manager, KWOK, this bench) and the cores they kept busy;
the `window_*` keys are their medians over rounds. On these two cores the
window is saturated, so the rate is the cores over the CPU per pod, and the
split shows whose CPU a ratio comes from. overcommit_violations
re-checks every device of every node from the pods' assignment annotations,
after each lj-scheduler whole-GPU round and after the slice and gang runs.
"""

from __future__ import annotations

import argparse
import math
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.envtest import kwok
from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory
from lj_runtimekit.envtest.process import Process
from lj_runtimekit.proto.pkg.kube import MERGE_PATCH, KubeClient
from lj_runtimekit.proto.pkg.protocol import (
    ADMISSION_KUBELET_ORDER,
    load_protocol,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import Args as GpuShareArgs
from lj_runtimekit.testkit.benchpart import write_part
from lj_runtimekit.testkit.invariant import assignment_holdings, sharing_violations
from lj_runtimekit.testkit.ports import free_port

sys.path.insert(0, str(Path(__file__).parent))
from bench_gang import run_gang_bench  # type: ignore[import-not-found]  # a script beside this one

P = load_protocol()
QPS, BURST = 5000, 10000


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


RUNTIME_CLASS = GpuShareArgs.runtime_class_name
"""Device pods run with the Runtime's handler (without it lj-scheduler warns on the pod)."""


def pod_body(name: str, scheduler: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "runtimeClassName": RUNTIME_CLASS,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def make_runtime_class(kube: KubeClient) -> None:
    """The RuntimeClass every bench pod names (the RuntimeClass admission plugin refuses
    pods naming a missing one)."""
    kube.request(
        "POST",
        "/apis/node.k8s.io/v1/runtimeclasses",
        body={
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": RUNTIME_CLASS},
            "handler": RUNTIME_CLASS,
        },
    )


def create_pods(kube: KubeClient, ns: str, scheduler: str, n: int, limits: dict[str, str]) -> None:
    def one(i: int) -> None:
        kube.request(
            "POST", f"/api/v1/namespaces/{ns}/pods", body=pod_body(f"p{i}", scheduler, limits)
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


STAND_IN_RECORD = "bench.lj-runtimekit.io/allocated-devices"
STAND_IN_PHASE = "bench.lj-runtimekit.io/bind-phase"
"""Keys of the stand-in record on the kube-scheduler's pods (see BindWatch)."""


def follow_watch(
    kube: KubeClient,
    path: str,
    rv: str,
    stop: threading.Event,
    handle: Callable[[str, dict[str, Any]], None],
) -> None:
    """`handle(type, object)` for each event of `path`'s watch from `rv` until `stop` is
    set; a broken stream is resumed from the last version seen."""
    while not stop.is_set():
        try:
            for kind, obj in kube.watch(path, rv, timeout_s=60):
                rv = obj["metadata"].get("resourceVersion", rv)
                handle(kind, obj)
                if stop.is_set():
                    return
        except Exception as exc:  # the stream broke: resume from the last version
            if stop.is_set():
                return
            log(f"watch of {path} broke ({exc}); resuming")


class BindWatch:
    """Records when each pod of a namespace gets a node (from a watch), and plays the
    nodes' Device Plugins for lj-scheduler's pods: a pod bound with an assignment gets
    what the plugin writes once its containers are allocated (`allocated_devices` = the
    assignment, `bind_phase: allocated`), one patch per pod (the plugin sends it as a
    strategic merge patch, the bench as a JSON merge patch: the API server's cost is about
    the same, see bench_writes.py).
    That ends the pod's admission on its node (docs/protocol.md); the nodes announce the
    plugin's default mode, `kubelet-order` (see `announce_admission`), so the scheduler
    does not wait for it between two pods of one node.

    With `stand_in_records` a pod bound without an assignment (the kube-scheduler's) gets
    a write of the same shape and size under keys no component reads: the matched-work
    run, where the API server does the same writes for both schedulers' pods."""

    def __init__(
        self,
        kube: KubeClient,
        ns: str,
        plugins_kubeconfig: str | None = None,
        stand_in_records: bool = False,
    ) -> None:
        self.kube = kube
        self.stand_in_records = stand_in_records
        self.plugins = (
            KubeClient.connect(plugins_kubeconfig, pool_size=64) if plugins_kubeconfig else kube
        )
        """The Device Plugins' API connections: their own pool, as large as their writers,
        from `plugins_kubeconfig` (closed once `wait` returns), else `kube`'s."""
        self.path = f"/api/v1/namespaces/{ns}/pods"
        self.times: dict[str, float] = {}
        self.stop = threading.Event()
        self._snapshot: Callable[[], dict[str, float]] | None = None
        self._window_n = 0
        self._window: list[tuple[float, dict[str, float]]] = []
        self._allocating: set[str] = set()
        self.recorded: list[float] = []
        """When each record's write was answered (the Device Plugins' threads append)."""
        # One Device Plugin per node writes its own records: many writers at once.
        self._plugins = ThreadPoolExecutor(64, thread_name_prefix="device-plugin")
        _, self.rv = kube.list_all(self.path)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    records = True
    """Play the Device Plugins' records (`--no-plugin-records`: a diagnostic run without
    them, the scheduler's own cost against the kube-scheduler's; not the protocol's work)."""

    def _allocate(self, obj: dict[str, Any]) -> None:
        """What a node's Device Plugin records after serving the pod's Allocate calls."""
        if not self.records:
            return
        a = P.annotations
        annotations = obj["metadata"].get("annotations") or {}
        name = obj["metadata"]["name"]
        if name in self._allocating:
            return
        if a.assigned_devices in annotations:
            if annotations.get(a.bind_phase) != "allocating":
                return
            record = {
                a.allocated_devices: annotations[a.assigned_devices],
                a.bind_phase: "allocated",
            }
        elif self.stand_in_records:
            device = f'{{"main":[{{"id":"{obj["spec"]["nodeName"]}-gpu0"}}]}}'
            record = {STAND_IN_RECORD: device, STAND_IN_PHASE: "allocated"}
        else:
            return
        self._allocating.add(name)
        self._plugins.submit(self._record, name, {"metadata": {"annotations": record}})

    def _record(self, name: str, body: dict[str, Any]) -> None:
        self.plugins.request("PATCH", f"{self.path}/{name}", body=body, content_type=MERGE_PATCH)
        self.recorded.append(time.monotonic())

    def _run(self) -> None:
        follow_watch(self.kube, self.path, self.rv, self.stop, self._event)

    def _event(self, _: str, obj: dict[str, Any]) -> None:
        if obj.get("spec", {}).get("nodeName"):
            self._bound(obj["metadata"]["name"])
            self._allocate(obj)

    def measure_window(self, snapshot: Callable[[], dict[str, float]], n: int) -> None:
        """Take `snapshot()` (CPU seconds by process) at the first bind and at the `n`-th:
        `window_cost` of the run's bind window."""
        self._snapshot, self._window_n = snapshot, n

    def _bound(self, name: str) -> None:
        if name in self.times:
            return
        now = time.monotonic()
        # the snapshot first: `wait` returns once it sees the n-th bind
        if self._snapshot is not None and len(self.times) + 1 in (1, self._window_n):
            self._window.append((now, self._snapshot()))
        self.times[name] = now

    def window_cost(self) -> dict[str, float]:
        """`window_cost` between the snapshots of `measure_window`."""
        (began, first), (ended, last) = self._window
        return window_cost(first, last, len(self.times) - 1, ended - began)

    def wait(self, n: int, timeout_s: float) -> float:
        """Pods/s from the first to the last of `n` binds; returns once the Device Plugins'
        records of those pods are written too (none left for the next run)."""
        deadline = time.monotonic() + timeout_s
        while len(self.times) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.times)}/{n} pods bound in {timeout_s:.0f}s")
            time.sleep(0.1)
        self.stop.set()
        self._plugins.shutdown(wait=True)
        if self.plugins is not self.kube:
            self.plugins.close()
        ts = sorted(self.times.values())
        return (len(ts) - 1) / (ts[-1] - ts[0])

    def rate_to_records(self) -> float | None:
        """Pods/s from the first bind to the last record written (once `wait` returned): the
        rate at which a scheduler's pods are placed with the protocol's work behind each of
        them done, records included (about half of them are written after the last bind, in
        the kube-scheduler's runs and in ours). None without records."""
        if not self.recorded:
            return None
        return (len(self.times) - 1) / (max(self.recorded) - min(self.times.values()))


def wait_scheduled_events(kube: KubeClient, ns: str, n: int, timeout_s: float = 300) -> None:
    """Waits for the `n` Scheduled events of a run: a scheduler writes them behind its binds
    (lj-scheduler's event senders trail them), and what is still unwritten at the last bind
    would otherwise be cut when the process stops, or land in the next run's minute."""
    began = time.monotonic()
    query = {"fieldSelector": "reason=Scheduled"}
    while len(kube.list_all(f"/api/v1/namespaces/{ns}/events", query)[0]) < n:
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"fewer than {n} Scheduled events in {ns} after {timeout_s:.0f}s")
        time.sleep(0.5)
    log(f"{ns}: Scheduled events all written {time.monotonic() - began:.1f}s after the binds")


KWOK_NICE = -5


def prioritise_node_simulator(cp: ControlPlane) -> None:
    """Runs KWOK ahead of everything else on the machine (nice KWOK_NICE).

    KWOK stands in for the kubelets, which in a cluster run on their own machines: their
    node heartbeats and lease renewals reach the API server at a steady rate whatever the
    scheduler does. Here KWOK shares two cores with both schedulers, and at equal priority
    it got less CPU while the scheduler under test took more (0.06 to 0.17 of a core
    during the kube-scheduler's runs, 0.2 to 0.3 during lj-scheduler's)."""
    for proc in cp.processes:
        if proc.name == "kwok" and proc.pid is not None:
            try:  # a nice value is per thread on Linux: each of KWOK's threads
                for tid in os.listdir(f"/proc/{proc.pid}/task"):
                    try:
                        os.setpriority(os.PRIO_PROCESS, int(tid), KWOK_NICE)
                    except ProcessLookupError:  # the thread ended meanwhile
                        continue
            except PermissionError:
                log(f"KWOK left at normal priority (nice {KWOK_NICE} needs CAP_SYS_NICE)")


def announce_admission(kube: KubeClient, names: list[str]) -> None:
    """What each node's Device Plugin writes at start when it reads the kubelet's own pod
    list (the default): `annotations.node_admission: kubelet-order`."""

    def one(name: str) -> None:
        body = {
            "metadata": {"annotations": {P.annotations.node_admission: ADMISSION_KUBELET_ORDER}}
        }
        kube.request("PATCH", f"/api/v1/nodes/{name}", body=body, content_type=MERGE_PATCH)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, names))


def make_namespace(kube: KubeClient, ns: str) -> None:
    kube.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # pods need the default ServiceAccount (admission)
        try:
            kube.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            return
        except Exception:
            time.sleep(0.2)
    kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts",
        body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
    )


def delete_pods(kube: KubeClient, ns: str) -> None:
    items, _ = kube.list_all(f"/api/v1/namespaces/{ns}/pods")

    def one(obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        kube.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", query={"gracePeriodSeconds": 0}
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, items))
    deadline = time.monotonic() + 120
    while kube.list_all(f"/api/v1/namespaces/{ns}/pods")[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {ns} not deleted")
        time.sleep(0.5)
    # KWOK answers each deletion with a DELETE of its own (a 404 once the pod is gone),
    # seconds behind on a busy machine: wait until those stop, or they land in the next run.
    count = pod_deletes(kube)
    while True:
        time.sleep(1.0)
        now = pod_deletes(kube)
        if now == count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod DELETE requests still coming after deleting {ns}")
        count = now


def pod_deletes(kube: KubeClient) -> float:
    """The API server's pod DELETE requests so far, whatever their answer."""
    return apiserver_counters(kube)[1].get("DELETE pods", 0.0)


def histogram_quantiles(text: str, name: str, qs: tuple[float, ...]) -> list[float]:
    """Quantiles in ms of a Prometheus histogram, interpolated within buckets (the series of
    every label set summed). ValueError when the text has no such histogram."""
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            upper = float("inf") if bound == "+Inf" else float(bound)
            counts[upper] = counts.get(upper, 0.0) + float(line.split()[-1])
    buckets = sorted(counts.items())
    if not buckets:
        raise ValueError(f"no histogram {name} in the metrics")
    total = buckets[-1][1]
    out: list[float] = []
    for q in qs:
        target = q * total
        prev_le, prev_c = 0.0, 0.0
        for le, c in buckets:
            if c >= target:
                if le == float("inf"):
                    out.append(prev_le * 1000)
                else:
                    frac = (target - prev_c) / (c - prev_c) if c > prev_c else 1.0
                    out.append((prev_le + frac * (le - prev_le)) * 1000)
                break
            prev_le, prev_c = le, c
    return out


def overcommit_violations(kube: KubeClient) -> int:
    """Breaches of the sharing invariant in the scheduler's assignments of every pod."""
    pods, _ = kube.list_all("/api/v1/pods")
    return len(sharing_violations("scheduler", assignment_holdings(pods, P)))


WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def apiserver_counters(kube: KubeClient) -> tuple[float, dict[str, float]]:
    """The API server's CPU seconds and requests ("VERB resource/subresource", every answer
    summed) so far, from its /metrics."""
    text = kube.request_bytes("GET", "/metrics", accept="text/plain").decode()
    cpu = 0.0
    requests: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            cpu = float(line.split()[-1])
        elif line.startswith("apiserver_request_total{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
            )
            verb = labels.get("verb", "").strip('"')
            what = labels.get("resource", "").strip('"')
            sub = labels.get("subresource", "").strip('"')
            key = f"{verb} {what}/{sub}" if sub else f"{verb} {what}"
            requests[key] = requests.get(key, 0.0) + float(line.split()[-1])
    return cpu, requests


class ApiServerMeter:
    """The API server's CPU seconds and requests over one run (`apiserver_counters`): what
    each scheduler's pods cost the API server, whatever else the machine runs (on a shared
    machine the rates swing with the load, these per-pod costs less)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.cpu_s, self.requests = apiserver_counters(kube)

    def per_pod(self, n: int) -> tuple[float, dict[str, float]]:
        """(API server CPU ms per pod, requests per pod by verb and resource) since creation.
        The CPU includes what the API server does meanwhile for others (node heartbeats,
        leases): more per pod for the slower run."""
        cpu_s, requests = apiserver_counters(self.kube)
        diff = {k: (v - self.requests.get(k, 0.0)) / n for k, v in requests.items()}
        return (cpu_s - self.cpu_s) * 1000 / n, {
            k: round(v, 2) for k, v in diff.items() if v >= 0.01
        }


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory so far, in MB (Linux /proc VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmHWM in /proc/{pid}/status")


def process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(cp: ControlPlane, scheduler_pid: int) -> Callable[[], dict[str, float]]:
    """CPU seconds so far of every process a bind window shares the machine among: the
    control plane's (etcd, API server, controller manager, KWOK), the scheduler under test
    and this bench (the nodes' Device Plugins and the watch)."""
    pids = {p.name: p.pid for p in cp.processes if p.pid is not None}
    pids |= {"scheduler": scheduler_pid, "bench": os.getpid()}
    return lambda: {name: process_cpu_s(pid) for name, pid in pids.items()}


def window_cost(
    first: Mapping[str, float], last: Mapping[str, float], binds: int, seconds: float
) -> dict[str, float]:
    """CPU ms per bind of each process between two snapshots (`cpu_snapshot`) taken at the
    first bind and `binds` binds and `seconds` later, with their `total` and the `cores`
    they kept busy. On a saturated machine the rate is `cores` / `total`: which process
    spends what per pod explains a ratio, whatever the machine's speed at that minute."""
    out = {name: (last[name] - first[name]) * 1000 / binds for name in first}
    total = sum(out.values())
    return out | {"total": total, "cores": total * binds / 1000 / seconds}


PROFILED = """
import atexit, cProfile, runpy, sys, threading, time
out, profiles = sys.argv.pop(1), []
def start(*_):
    p = cProfile.Profile(time.thread_time)
    profiles.append(p)
    p.enable()
def dump():
    for p in profiles:
        p.disable()
    import pstats
    pstats.Stats(*profiles).dump_stats(out)
threading.setprofile(start)
atexit.register(dump)
start()
sys.argv[0] = "lj-scheduler"
runpy.run_module("lj_runtimekit.schedulerframework.cmd.scheduler.main", run_name="__main__")
"""
"""Runs lj-scheduler with every thread under cProfile timed in that thread's CPU time
(`--profile`); the merged stats go to the file named first."""

PROFILE_DIR: Path | None = None
"""Where `--profile` writes lj-scheduler's stats (one file per run)."""


def start_lj(
    cp: ControlPlane, work: Path, config: Path, ns: str
) -> tuple[subprocess.Popen[bytes], int]:
    """lj-scheduler with `config`; (process, its metrics port)."""
    port = free_port()
    if PROFILE_DIR is None:
        command = [sys.executable, "-m", "lj_runtimekit.schedulerframework.cmd.scheduler.main"]
    else:
        command = [sys.executable, "-c", PROFILED, str(PROFILE_DIR / f"lj-scheduler-{ns}.prof")]
    with (work / f"lj-scheduler-{ns}.log").open("wb") as out:
        lj = subprocess.Popen(
            [
                *command,
                f"--config={config}",
                f"--kubeconfig={cp.kubeconfig_path}",
                f"--metrics-port={port}",
                "--log-format=text",
                "--log-level=warning",
            ],
            stdout=out,
            stderr=out,
            env=dict(os.environ),
        )
    return lj, port


@dataclass(frozen=True)
class SchedulerRun:
    """What one scheduler's run of `n` pods measured."""

    rate: float
    """Pods/s from the first to the last bind (`BindWatch.wait`)."""
    rate_to_records: float | None
    """Pods/s from the first bind to the last record written (`BindWatch.rate_to_records`)."""
    metrics: str
    """The scheduler's /metrics text at the end of the run."""
    cpu_ms_per_pod: float
    """The scheduler process's CPU, start-up included, over `n`."""
    cost: tuple[float, dict[str, float]]
    """What the pods cost the API server (`ApiServerMeter.per_pod`)."""
    rss_mb: float
    """The scheduler's peak resident memory."""
    window: dict[str, float]
    """The bind window's `window_cost`."""


def run_lj(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    config: Path,
    ns: str,
    n: int,
    limits: dict[str, str],
) -> SchedulerRun:
    """Creates `n` pods, starts lj-scheduler, waits for all binds, records and events."""
    make_namespace(kube, ns)
    create_pods(kube, ns, "lj-bench", n, limits)
    watch = BindWatch(kube, ns, str(cp.kubeconfig_path))
    meter = ApiServerMeter(kube)
    lj, port = start_lj(cp, work, config, ns)
    watch.measure_window(cpu_snapshot(cp, lj.pid), n)
    try:
        log(f"lj-scheduler run ({ns}, {limits})")
        rate = watch.wait(n, 600)
        wait_scheduled_events(kube, ns, n)
        cost = meter.per_pod(n)
        window = watch.window_cost()
        to_records = watch.rate_to_records()
        log(f"lj-scheduler: {rate:.1f} pods/s{records_text(to_records)}; {api_cost_text(cost)}")
        log(f"lj-scheduler bind window: {window_text(window)}")
        cpu_s = process_cpu_s(lj.pid)
        rss_mb = peak_rss_mb(lj.pid)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            text = r.read().decode()
    finally:
        lj.terminate()
        lj.wait(30)
    return SchedulerRun(rate, to_records, text, cpu_s * 1000 / n, cost, rss_mb, window)


def writes(requests: dict[str, float]) -> float:
    """Write requests among `ApiServerMeter.per_pod`'s."""
    return sum(v for k, v in requests.items() if k.split()[0] in WRITE_VERBS)


def api_cost_text(cost: tuple[float, dict[str, float]]) -> str:
    cpu_ms, requests = cost
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(requests.items()))
    return f"API server {cpu_ms:.1f} CPU ms and {writes(requests):.2f} writes per pod ({shown})"


def records_text(rate: float | None) -> str:
    return "" if rate is None else f" ({rate:.1f} to the last record)"


def window_text(cost: dict[str, float]) -> str:
    shown = ", ".join(
        f"{k} {v:.2f}" for k, v in sorted(cost.items(), key=lambda kv: -kv[1]) if k != "cores"
    )
    return f"{cost['cores']:.2f} cores; CPU ms per pod: {shown}"


def _rounded(v: Any) -> Any:
    return [round(x, 3) for x in v] if isinstance(v, list) else round(v, 3)


KUBE_ALGORITHM = "scheduler_scheduling_algorithm_duration_seconds"


def kube_scheduler_config(
    cp: ControlPlane, work: Path, name: str, matched_percentage: int | None
) -> Path:
    """A KubeSchedulerConfiguration with one profile `name`; with `matched_percentage`, the
    matched-work profile (binpack on the GPU resource, that share of nodes scored)."""
    profile: dict[str, Any] = {"schedulerName": name}
    doc: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cp.kubeconfig_path), "qps": QPS, "burst": BURST},
        "leaderElection": {"leaderElect": False},
        "profiles": [profile],
    }
    if matched_percentage is not None:
        doc["percentageOfNodesToScore"] = matched_percentage
        profile["pluginConfig"] = [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [{"name": P.resources.gpu, "weight": 1}],
                    }
                },
            }
        ]
    path = work / f"kube-scheduler-{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_kube_scheduler(
    cp: ControlPlane, work: Path, name: str, matched_percentage: int | None
) -> tuple[Process, int]:
    """The stock kube-scheduler with profile `name`; (process, its secure metrics port)."""
    port = free_port()
    cfg = kube_scheduler_config(cp, work, name, matched_percentage)
    ks = Process("kube-scheduler", cp.kube_scheduler_argv(cfg, port), work / f"{name}.log")
    ks.start()
    return ks, port


def kube_scheduler_metrics(cp: ControlPlane, port: int) -> str:
    """The kube-scheduler's /metrics, read as the control plane's admin (client certificate)."""
    assert cp.pki is not None
    ctx = ssl.create_default_context(cafile=str(cp.pki.ca_cert))
    ctx.load_cert_chain(str(cp.pki.admin_cert), str(cp.pki.admin_key))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx) as r:
        return str(r.read().decode())


def run_kube_scheduler(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    ns: str,
    n: int,
    matched_percentage: int | None = None,
) -> SchedulerRun:
    """The stock kube-scheduler places `n` whole-GPU pods (on matched work with
    `matched_percentage`: the stand-in records too)."""
    make_namespace(kube, ns)
    create_pods(kube, ns, ns, n, {P.resources.gpu: "1"})
    matched = matched_percentage is not None
    watch = BindWatch(
        kube, ns, str(cp.kubeconfig_path) if matched else None, stand_in_records=matched
    )
    shown = f", matched work {matched_percentage}% of nodes" if matched_percentage else ""
    log(f"kube-scheduler run ({ns}{shown})")
    meter = ApiServerMeter(kube)
    ks, port = start_kube_scheduler(cp, work, ns, matched_percentage)
    assert ks.pid is not None
    watch.measure_window(cpu_snapshot(cp, ks.pid), n)
    try:
        rate = watch.wait(n, 600)
        wait_scheduled_events(kube, ns, n)
        cost = meter.per_pod(n)
        window = watch.window_cost()
        to_records = watch.rate_to_records()
        cpu_ms = process_cpu_s(ks.pid) * 1000 / n
        rss_mb = peak_rss_mb(ks.pid)
        text = kube_scheduler_metrics(cp, port)
    finally:
        ks.stop()
    log(f"kube-scheduler: {rate:.1f} pods/s{records_text(to_records)}; {api_cost_text(cost)}")
    log(f"kube-scheduler bind window: {window_text(window)}")
    return SchedulerRun(rate, to_records, text, cpu_ms, cost, rss_mb, window)


def matched_percentage(nodes: int) -> int:
    """The share of nodes lj-scheduler scores for a whole-GPU pod, as a percentage."""
    return max(1, min(100, math.ceil(100 * GpuShareArgs.ranked_nodes_to_score / nodes)))


def quantiles_ms(text: str, metric: str) -> tuple[float, float]:
    p50, p99 = histogram_quantiles(text, metric, (0.5, 0.99))
    return p50, p99


WINDOW_KEYS = {
    "window_cpu_ms_per_whole_gpu_pod": "total",
    "window_apiserver_cpu_ms_per_whole_gpu_pod": "kube-apiserver",
    "window_scheduler_cpu_ms_per_whole_gpu_pod": "scheduler",
    "window_cores": "cores",
}
"""Result keys (after a scheduler's prefix) from each run's bind window (`window_cost`),
medians over rounds."""

MEDIAN_CONFIDENCE = 0.9


def median_interval(
    values: list[float], confidence: float = MEDIAN_CONFIDENCE
) -> tuple[float, float, float]:
    """A distribution-free interval that holds the true median of what `values` sample
    with at least `confidence` probability: the k-th smallest and k-th largest value, k
    the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. With too few
    values for that (fewer than 5 at 90 %), the smallest and the largest.
    (low, high, the interval's exact coverage)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    ordered = sorted(values)
    below = 0.0  # P(Binomial(n, 1/2) < k)
    k = 0
    while k < (n + 1) // 2 and below + math.comb(n, k) / 2**n <= (1 - confidence) / 2:
        below += math.comb(n, k) / 2**n
        k += 1
    if k == 0:  # too few values: the whole range, P(Binomial(n, 1/2) < 1) outside each end
        k, below = 1, 1 / 2**n
    return ordered[k - 1], ordered[n - k], 1 - 2 * below


def run_whole_rounds(
    kube: KubeClient, cp: ControlPlane, work: Path, lj_cfg: Path, n: int, rounds: int, nodes: int
) -> tuple[dict[str, Any], int]:
    """Alternating whole-GPU rounds of both schedulers (the kube-scheduler with its default
    profile and on matched work): (medians plus the per-round values, overcommit
    violations found after the lj-scheduler rounds)."""
    runs: dict[str, list[SchedulerRun]] = {"lj": [], "kube": [], "matched": []}
    pct = matched_percentage(nodes)
    violations = 0
    for r in range(rounds):
        order = ("kube", "lj", "matched") if r % 2 == 0 else ("matched", "lj", "kube")
        for which in order:
            if which == "kube":
                ns = f"bench-kube-{r}"
                run = run_kube_scheduler(kube, cp, work, ns, n)
            elif which == "matched":
                ns = f"bench-kube-matched-{r}"
                run = run_kube_scheduler(kube, cp, work, ns, n, pct)
            else:
                ns = f"bench-lj-{r}"
                run = run_lj(kube, cp, work, lj_cfg, ns, n, {P.resources.gpu: "1"})
                violations += overcommit_violations(kube)
            runs[which].append(run)
            delete_pods(kube, ns)
        ours_now, kube_now, matched_now = (runs[w][-1] for w in ("lj", "kube", "matched"))
        log(
            f"round {r + 1}/{rounds}: ratio {ours_now.rate / kube_now.rate:.2f}, "
            f"matched work {ours_now.rate / matched_now.rate:.2f}"
        )
    ours = [run.rate for run in runs["lj"]]
    theirs = [run.rate for run in runs["kube"]]
    matched = [run.rate for run in runs["matched"]]
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    matched_ratios = [a / b for a, b in zip(ours, matched, strict=True)]

    def median_round(rates: list[float]) -> int:
        return sorted(range(rounds), key=lambda i: rates[i])[rounds // 2]

    text = runs["lj"][median_round(ours)].metrics
    # the coverage follows from the number of rounds alone: the same for both ratios
    low, high, coverage = median_interval(ratios)
    out: dict[str, Any] = {
        "whole_gpu_pods_per_s": statistics.median(ours),
        "kube_scheduler_whole_gpu_pods_per_s": statistics.median(theirs),
        "whole_gpu_ratio_vs_kube_scheduler": statistics.median(ratios),
        "whole_gpu_ratio_min": min(ratios),
        "whole_gpu_ratio_max": max(ratios),
        "whole_gpu_ratio_per_round": ratios,
        "whole_gpu_pods_per_s_per_round": ours,
        "kube_scheduler_whole_gpu_pods_per_s_per_round": theirs,
        "whole_gpu_ratio_interval": [low, high],
        "whole_gpu_ratio_matched_work": statistics.median(matched_ratios),
        "whole_gpu_ratio_matched_work_interval": list(median_interval(matched_ratios)[:2]),
        "whole_gpu_ratio_interval_coverage": round(coverage, 3),
        "whole_gpu_ratio_matched_work_per_round": matched_ratios,
        "kube_scheduler_matched_whole_gpu_pods_per_s": statistics.median(matched),
        "kube_scheduler_matched_whole_gpu_pods_per_s_per_round": matched,
        "kube_scheduler_matched_percentage_of_nodes_to_score": pct,
        "cpu_ms_per_whole_gpu_pod": statistics.median(run.cpu_ms_per_pod for run in runs["lj"]),
        "kube_scheduler_cpu_ms_per_whole_gpu_pod": statistics.median(
            run.cpu_ms_per_pod for run in runs["kube"]
        ),
        "rss_mb": max(run.rss_mb for run in runs["lj"]),
        "kube_scheduler_rss_mb": max(run.rss_mb for run in runs["kube"]),
        "whole_gpu_rounds": rounds,
    }
    out.update(to_records_keys(runs["lj"], runs["matched"]))
    for prefix, which in (
        ("", "lj"),
        ("kube_scheduler_", "kube"),
        ("kube_scheduler_matched_", "matched"),
    ):
        out[f"{prefix}apiserver_cpu_ms_per_whole_gpu_pod"] = statistics.median(
            run.cost[0] for run in runs[which]
        )
        out[f"{prefix}apiserver_writes_per_whole_gpu_pod"] = statistics.median(
            writes(run.cost[1]) for run in runs[which]
        )
        for key, part in WINDOW_KEYS.items():
            out[f"{prefix}{key}"] = statistics.median(run.window[part] for run in runs[which])
    for key, metric in (
        ("filter_score", "lj_scheduler_filter_score_duration_seconds"),
        ("filter_score_cpu", "lj_scheduler_filter_score_cpu_seconds"),
        ("bind", "lj_scheduler_binding_duration_seconds"),
        ("admission", "lj_scheduler_admission_duration_seconds"),
    ):
        out[f"{key}_p50_ms"], out[f"{key}_p99_ms"] = quantiles_ms(text, metric)
    for key, which, rates in (
        ("kube_scheduler_algorithm", "kube", theirs),
        ("kube_scheduler_matched_algorithm", "matched", matched),
    ):
        out[f"{key}_p50_ms"], out[f"{key}_p99_ms"] = quantiles_ms(
            runs[which][median_round(rates)].metrics, KUBE_ALGORITHM
        )
    return out, violations


def to_records_keys(ours: list[SchedulerRun], matched: list[SchedulerRun]) -> dict[str, Any]:
    """The matched-work comparison to the last record of each run (`rate_to_records`): the
    medians, the ratio's per-round values and interval; nothing for runs without records
    (`--no-plugin-records`)."""
    mine = [run.rate_to_records for run in ours if run.rate_to_records is not None]
    theirs = [run.rate_to_records for run in matched if run.rate_to_records is not None]
    if len(mine) < len(ours) or len(theirs) < len(matched):
        return {}
    ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
    return {
        "whole_gpu_ratio_matched_work_to_records": statistics.median(ratios),
        "whole_gpu_ratio_matched_work_to_records_interval": list(median_interval(ratios)[:2]),
        "whole_gpu_ratio_matched_work_to_records_per_round": ratios,
        "whole_gpu_pods_per_s_to_records": statistics.median(mine),
        "kube_scheduler_matched_whole_gpu_pods_per_s_to_records": statistics.median(theirs),
    }


def run_open_loop(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    lj_cfg: Path,
    nodes: int,
    rate: float,
    seconds: float,
) -> dict[str, Any]:
    """Both schedulers warm and synced; whole-GPU pods arrive at `rate` per second in all,
    alternating between them; create-to-bind p50/p99 of each."""
    ns = "bench-open"
    kube_name = f"{ns}-kube"
    make_namespace(kube, ns)
    watch = BindWatch(kube, ns, str(cp.kubeconfig_path))
    lj, _ = start_lj(cp, work, lj_cfg, ns)
    ks, _ = start_kube_scheduler(cp, work, kube_name, matched_percentage(nodes))
    gpu = {P.resources.gpu: "1"}

    def create(name: str, scheduler: str) -> None:
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod_body(name, scheduler, gpu))

    try:
        create("warm-lj", "lj-bench")
        create("warm-kube", kube_name)
        deadline = time.monotonic() + 120
        while not {"warm-lj", "warm-kube"} <= set(watch.times):
            if time.monotonic() > deadline:
                raise TimeoutError("the warm-up pods were not bound in 120s")
            time.sleep(0.1)
        total = int(rate * seconds)
        log(f"open loop: {total} pods at {rate:g}/s, both schedulers warm")
        arrival: dict[str, float] = {}
        with ThreadPoolExecutor(32) as pool:
            start = time.monotonic()
            for i in range(total):
                due = start + i / rate
                time.sleep(max(0.0, due - time.monotonic()))
                name, scheduler = (f"lj-{i}", "lj-bench") if i % 2 == 0 else (f"ks-{i}", kube_name)
                arrival[name] = due
                pool.submit(create, name, scheduler)
        watch.wait(total + 2, 300)
    finally:
        lj.terminate()
        lj.wait(30)
        ks.stop()
    out: dict[str, Any] = {"open_loop_rate_pods_per_s": rate, "open_loop_pods": total}
    for key, prefix in (("open_loop", "lj-"), ("kube_scheduler_open_loop", "ks-")):
        ms = sorted(
            (watch.times[name] - due) * 1000 for name, due in arrival.items() if name[:3] == prefix
        )
        out[f"{key}_create_to_bind_p50_ms"] = ms[len(ms) // 2]
        out[f"{key}_create_to_bind_p99_ms"] = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    delete_pods(kube, ns)
    log(
        f"open loop create-to-bind p99: lj-scheduler {out['open_loop_create_to_bind_p99_ms']:.0f}"
        f" ms, kube-scheduler {out['kube_scheduler_open_loop_create_to_bind_p99_ms']:.0f} ms"
    )
    return out


def run_in_memory(nodes: int, pods: int) -> dict[str, Any]:
    """The scheduling cycle alone, on the in-memory API server double (no control plane,
    no other process): `pods` one-GPU pods on `nodes` 8-GPU nodes, one cycle at a time;
    each filter+score (the span of lj_scheduler_filter_score_duration_seconds) timed in wall
    clock and in the thread's CPU time. Quantiles are nearest-rank, in ms."""
    from lj_runtimekit.testkit.scheduler.fake import FakeCluster

    cluster = FakeCluster()
    for i in range(nodes):
        cluster.add_node(f"gpu-{i:04d}")
    for i in range(pods):
        cluster.add_pod(f"p{i}", {P.resources.gpu: "1"})
    scheduler = cluster.scheduler
    wall: list[float] = []
    cpu: list[float] = []
    find = scheduler._find_node

    def timed(*args: Any) -> Any:
        began, began_cpu = time.perf_counter(), time.thread_time()
        try:
            return find(*args)
        finally:
            wall.append((time.perf_counter() - began) * 1000)
            cpu.append((time.thread_time() - began_cpu) * 1000)

    scheduler._find_node = timed  # type: ignore[method-assign,assignment]
    cluster.schedule(max_cycles=pods)
    bound = scheduler.bound
    scheduler.stop()
    out: dict[str, Any] = {"in_memory_nodes": nodes, "in_memory_pods_bound": bound}
    for key, values in (("filter_score", wall), ("filter_score_cpu", cpu)):
        ordered = sorted(values)
        for q in (50, 99):
            rank = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
            out[f"in_memory_{key}_p{q}_ms"] = ordered[rank]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/parts/scheduler.json")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--share-pods", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=11, help="whole-GPU rounds of both schedulers")
    ap.add_argument(
        "--bind-workers", type=int, default=None, help="lj-scheduler's bindWorkers (its default)"
    )
    ap.add_argument("--open-loop-rate", type=float, default=50.0, help="pods/s, both together")
    ap.add_argument("--open-loop-seconds", type=float, default=20.0)
    ap.add_argument(
        "--whole-only", action="store_true", help="only the whole-GPU rounds (a scale run)"
    )
    ap.add_argument("--key-prefix", default="", help="before every result key, e.g. n5000_")
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="directory: run lj-scheduler under cProfile (thread CPU time), stats per run there",
    )
    ap.add_argument(
        "--no-plugin-records",
        action="store_true",
        help="diagnostic: no Device Plugin records (the API server does the schedulers' work only)",
    )
    ap.add_argument(
        "--in-memory",
        action="store_true",
        help="only the scheduling cycle's latencies on the in-memory double (no control plane)",
    )
    args = ap.parse_args()
    if args.in_memory:
        load = os.getloadavg()[0]
        doc = {k: _rounded(v) for k, v in run_in_memory(args.nodes, args.pods).items()}
        doc["in_memory_load_avg_1m"] = round(max(load, os.getloadavg()[0]), 1)
        write_part(
            Path(args.out), {f"{args.key_prefix}{k}": v for k, v in doc.items()}, "scheduler"
        )
        return 0
    BindWatch.records = not args.no_plugin_records
    global PROFILE_DIR
    PROFILE_DIR = args.profile
    if PROFILE_DIR is not None:
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    load_at_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="ljbench"))
    # KWOK plays no kubelet for pods (see the module docstring); it still removes deleted ones.
    cfg = ControlPlaneConfig(
        controller_manager=True,
        scheduler=False,
        kwok=True,
        verbosity=0,
        kwok_stages=kwok.stages_named("pod-delete"),
    )
    results: dict[str, Any] = {}
    with ControlPlane(cfg) as cp:
        api = cp.api_client()
        kube = KubeClient(api)
        log(f"control plane up in {cp.ready_s:.1f}s; creating {args.nodes} nodes x 8 GPUs")
        prioritise_node_simulator(cp)
        factory = NodeFactory(api, group="bench")
        specs = [GpuNodeSpec(name=f"gpu-{i:04d}") for i in range(args.nodes)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda s: factory.create_many([s]), specs))
        # the node lifecycle controller lifts the not-ready taint once KWOK reports Ready
        factory.wait_ready([s.name for s in specs], timeout_s=max(600, args.nodes * 0.3))
        announce_admission(kube, [s.name for s in specs])
        make_runtime_class(kube)
        log("nodes ready")

        lj_cfg = work / "lj-scheduler.yaml"
        lj_cfg.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "scheduler.lingjun.com/v1",
                    "kind": "LjSchedulerConfiguration",
                    "clientConnection": {"qps": QPS, "burst": BURST},
                    "leaderElection": {"leaderElect": False},
                    "profiles": [{"schedulerName": "lj-bench"}],
                    **({"bindWorkers": args.bind_workers} if args.bind_workers else {}),
                }
            )
        )
        # 1. whole-GPU rounds, both schedulers
        whole, violations = run_whole_rounds(
            kube, cp, work, lj_cfg, args.pods, args.rounds, args.nodes
        )
        results.update(whole)
        if args.whole_only:
            results["overcommit_violations"] = violations
        else:
            violations += run_other_parts(kube, cp, work, lj_cfg, specs, args, results)
            results["overcommit_violations"] = overcommit_violations(kube) + violations
        api.close()
    out = {k: _rounded(v) for k, v in sorted(results.items())}
    out["nodes"] = args.nodes
    out["whole_gpu_pods"] = args.pods
    if not args.whole_only:
        out["share_pods"] = args.share_pods
    out["bench_duration_s"] = round(time.monotonic() - began, 1)
    out["load_avg_1m_at_start"] = round(load_at_start, 1)
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 1)
    out["cpus"] = os.cpu_count() or 0
    out_doc = {f"{args.key_prefix}{k}": v for k, v in out.items()}
    write_part(Path(args.out), out_doc, "scheduler")
    return 0


def run_other_parts(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    lj_cfg: Path,
    specs: list[GpuNodeSpec],
    args: argparse.Namespace,
    results: dict[str, Any],
) -> int:
    """The open loop, slices and gangs into `results`; overcommit violations after the open
    loop."""
    # 2. warm open loop, both schedulers at once
    results.update(
        run_open_loop(
            kube, cp, work, lj_cfg, args.nodes, args.open_loop_rate, args.open_loop_seconds
        )
    )
    violations = overcommit_violations(kube)

    # 3. lj-scheduler, slices (a fresh process, pods created before it starts)
    share = run_lj(
        kube,
        cp,
        work,
        lj_cfg,
        "bench-share",
        args.share_pods,
        {P.resources.core: "25", P.resources.memory: "25"},
    )
    results["share_pods_per_s"] = share.rate
    results["cpu_ms_per_share_pod"] = share.cpu_ms_per_pod
    results["share_filter_score_p50_ms"], results["share_filter_score_p99_ms"] = quantiles_ms(
        share.metrics, "lj_scheduler_filter_score_duration_seconds"
    )
    # 4. gangs: a 256-pod gang, and four competing gangs (bench_gang.py)
    results.update(
        run_gang_bench(
            kube, cp, work, lj_cfg, [s.name for s in specs], make_namespace, BindWatch, log
        )
    )
    return violations


if __name__ == "__main__":
    sys.exit(main())
