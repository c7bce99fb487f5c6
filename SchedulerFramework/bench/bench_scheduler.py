"""Scheduler benchmark: lj-scheduler against the stock kube-scheduler, side by side.

One control plane (etcd, kube-apiserver, KWOK; no default scheduler), 1000
KWOK nodes x 8 GPUs. Every run starts from an empty namespace with its pods
created before the scheduler starts:

1. whole-GPU rounds (`--rounds`, default 5): in each round the stock
   kube-scheduler (pinned version, profile `bench-kube`) and lj-scheduler
   each place N whole-GPU pods, both with client QPS/burst 5000/10000; the
   order alternates between rounds so neither always runs on a warmer API
   server. Each round gives one ratio (ours / theirs, in the same minute);
   the reported rates and ratio are the medians over rounds, the per-round
   values are kept beside them;
2. lj-scheduler places N slice pods (core 25 % / memory 25 %);
3. gangs (bench_gang.py): a 256-pod gang on topology-labelled nodes
   (gang_256_place_s) and four competing gangs of which three fit
   (partial_gangs, gang_competing_whole).

Throughput is (N-1) / (last bind - first bind), from a watch. The
filter+score latencies come from lj-scheduler's histogram
(`lj_scheduler_filter_score_duration_seconds`, interpolated within buckets)
of the round with the median rate. CPU per pod is the scheduler process's
user+system time (start-up included) over N. overcommit_violations
re-checks every device of every node from the pods' assignment annotations,
after each lj-scheduler whole-GPU round and after the slice and gang runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory
from lj_runtimekit.envtest.process import Process
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import (
    ADMISSION_KUBELET_ORDER,
    load_protocol,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import Args as GpuShareArgs
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


def create_pods(kube: KubeClient, ns: str, scheduler: str, n: int, limits: dict[str, str]) -> None:
    def one(i: int) -> None:
        kube.request(
            "POST", f"/api/v1/namespaces/{ns}/pods", body=pod_body(f"p{i}", scheduler, limits)
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


class BindWatch:
    """Records when each pod of a namespace gets a node (from a watch), and plays the
    nodes' Device Plugins for lj-scheduler's pods: a pod bound with an assignment gets
    what the plugin writes once its containers are allocated (`allocated_devices` = the
    assignment, `bind_phase: allocated`), one merge patch per pod, as the plugin does.
    That ends the pod's admission on its node (docs/protocol.md); the nodes announce the
    plugin's default mode, `kubelet-order` (see `announce_admission`), so the scheduler
    does not wait for it between two pods of one node."""

    def __init__(self, kube: KubeClient, ns: str, plugins: KubeClient | None = None) -> None:
        self.kube = kube
        self.plugins = plugins or kube
        """The Device Plugins' own API connections (a pool as large as their writers)."""
        self.path = f"/api/v1/namespaces/{ns}/pods"
        self.times: dict[str, float] = {}
        self.stop = threading.Event()
        self._allocating: set[str] = set()
        # One Device Plugin per node writes its own records: many writers at once.
        self._plugins = ThreadPoolExecutor(64, thread_name_prefix="device-plugin")
        _, self.rv = kube.list_all(self.path)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _allocate(self, obj: dict[str, Any]) -> None:
        """What a node's Device Plugin records after serving the pod's Allocate calls."""
        a = P.annotations
        annotations = obj["metadata"].get("annotations") or {}
        name = obj["metadata"]["name"]
        if a.assigned_devices not in annotations or annotations.get(a.bind_phase) != "allocating":
            return
        if name in self._allocating:
            return
        self._allocating.add(name)
        body = {
            "metadata": {
                "annotations": {
                    a.allocated_devices: annotations[a.assigned_devices],
                    a.bind_phase: "allocated",
                }
            }
        }
        self._plugins.submit(
            self.plugins.request,
            "PATCH",
            f"{self.path}/{name}",
            body=body,
            content_type="application/merge-patch+json",
        )

    def _run(self) -> None:
        rv = self.rv
        while not self.stop.is_set():
            try:
                for _, obj in self.kube.watch(self.path, rv, timeout_s=60):
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if obj.get("spec", {}).get("nodeName"):
                        self.times.setdefault(obj["metadata"]["name"], time.monotonic())
                        self._allocate(obj)
                    if self.stop.is_set():
                        return
            except Exception as exc:  # the stream broke: resume from the last version
                if self.stop.is_set():
                    return
                log(f"watch of {self.path} broke ({exc}); resuming")

    def wait(self, n: int, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while len(self.times) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.times)}/{n} pods bound in {timeout_s:.0f}s")
            time.sleep(0.1)
        self.stop.set()
        self._plugins.shutdown(wait=False)
        ts = sorted(self.times.values())
        return (len(ts) - 1) / (ts[-1] - ts[0])


def announce_admission(kube: KubeClient, names: list[str]) -> None:
    """What each node's Device Plugin writes at start when it reads the kubelet's own pod
    list (the default): `annotations.node_admission: kubelet-order`."""

    def one(name: str) -> None:
        body = {
            "metadata": {"annotations": {P.annotations.node_admission: ADMISSION_KUBELET_ORDER}}
        }
        kube.request(
            "PATCH", f"/api/v1/nodes/{name}", body=body, content_type="application/merge-patch+json"
        )

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


def histogram_quantiles(text: str, name: str, qs: tuple[float, ...]) -> list[float]:
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            upper = float("inf") if bound == "+Inf" else float(bound)
            buckets.append((upper, float(line.split()[-1])))
    buckets.sort()
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


def process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_lj(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    config: Path,
    ns: str,
    n: int,
    limits: dict[str, str],
) -> tuple[float, str, float]:
    """Creates `n` pods, starts lj-scheduler, waits for all binds.

    Returns (pods/s, the scheduler's /metrics text, its CPU seconds).
    """
    make_namespace(kube, ns)
    create_pods(kube, ns, "lj-bench", n, limits)
    watch = BindWatch(kube, ns, KubeClient.connect(str(cp.kubeconfig_path), pool_size=64))
    port = free_port()
    with (work / f"lj-scheduler-{ns}.log").open("wb") as out:
        lj = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit.schedulerframework.cmd.scheduler.main",
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
    try:
        log(f"lj-scheduler run ({ns}, {limits})")
        rate = watch.wait(n, 600)
        log(f"lj-scheduler: {rate:.1f} pods/s")
        cpu_s = process_cpu_s(lj.pid)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            text = r.read().decode()
    finally:
        lj.terminate()
        lj.wait(30)
    return rate, text, cpu_s


def _rounded(v: Any) -> Any:
    return [round(x, 3) for x in v] if isinstance(v, list) else round(v, 3)


def run_kube_scheduler(
    kube: KubeClient, cp: ControlPlane, work: Path, ns: str, n: int
) -> tuple[float, float]:
    """The stock kube-scheduler places `n` whole-GPU pods; (pods/s, CPU ms per pod)."""
    make_namespace(kube, ns)
    create_pods(kube, ns, ns, n, {P.resources.gpu: "1"})
    watch = BindWatch(kube, ns)
    sched_cfg = work / f"kube-scheduler-{ns}.yaml"
    sched_cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {
                    "kubeconfig": str(cp.kubeconfig_path),
                    "qps": QPS,
                    "burst": BURST,
                },
                "leaderElection": {"leaderElect": False},
                "profiles": [{"schedulerName": ns}],
            }
        )
    )
    ks = Process(
        "kube-scheduler", cp.kube_scheduler_argv(sched_cfg), work / f"kube-scheduler-{ns}.log"
    )
    log(f"kube-scheduler run ({ns})")
    ks.start()
    try:
        rate = watch.wait(n, 600)
        assert ks.pid is not None
        cpu_ms = process_cpu_s(ks.pid) * 1000 / n
    finally:
        ks.stop()
    log(f"kube-scheduler: {rate:.1f} pods/s")
    return rate, cpu_ms


def run_whole_rounds(
    kube: KubeClient, cp: ControlPlane, work: Path, lj_cfg: Path, n: int, rounds: int
) -> tuple[dict[str, Any], int]:
    """Alternating whole-GPU rounds of both schedulers: (medians plus the per-round values,
    overcommit violations found after the lj-scheduler rounds)."""
    ours: list[float] = []
    theirs: list[float] = []
    ours_cpu: list[float] = []
    theirs_cpu: list[float] = []
    texts: list[str] = []
    violations = 0
    for r in range(rounds):
        order = ("kube", "lj") if r % 2 == 0 else ("lj", "kube")
        for which in order:
            if which == "kube":
                ns = f"bench-kube-{r}"
                rate, cpu_ms = run_kube_scheduler(kube, cp, work, ns, n)
                theirs.append(rate)
                theirs_cpu.append(cpu_ms)
            else:
                ns = f"bench-lj-{r}"
                rate, text, cpu_s = run_lj(kube, cp, work, lj_cfg, ns, n, {P.resources.gpu: "1"})
                ours.append(rate)
                ours_cpu.append(cpu_s * 1000 / n)
                texts.append(text)
                violations += overcommit_violations(kube)
            delete_pods(kube, ns)
        log(f"round {r + 1}/{rounds}: ratio {ours[-1] / theirs[-1]:.2f}")
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    median_round = sorted(range(rounds), key=lambda i: ours[i])[rounds // 2]
    text = texts[median_round]
    out: dict[str, Any] = {
        "whole_gpu_pods_per_s": statistics.median(ours),
        "kube_scheduler_whole_gpu_pods_per_s": statistics.median(theirs),
        "whole_gpu_ratio_vs_kube_scheduler": statistics.median(ratios),
        "whole_gpu_ratio_min": min(ratios),
        "whole_gpu_ratio_max": max(ratios),
        "whole_gpu_ratio_per_round": ratios,
        "whole_gpu_pods_per_s_per_round": ours,
        "kube_scheduler_whole_gpu_pods_per_s_per_round": theirs,
        "cpu_ms_per_whole_gpu_pod": statistics.median(ours_cpu),
        "kube_scheduler_cpu_ms_per_whole_gpu_pod": statistics.median(theirs_cpu),
        "whole_gpu_rounds": rounds,
    }
    for key, metric in (
        ("filter_score", "lj_scheduler_filter_score_duration_seconds"),
        ("filter_score_cpu", "lj_scheduler_filter_score_cpu_seconds"),
        ("bind", "lj_scheduler_binding_duration_seconds"),
        ("admission", "lj_scheduler_admission_duration_seconds"),
    ):
        p50, p99 = histogram_quantiles(text, metric, (0.5, 0.99))
        out[f"{key}_p50_ms"] = p50
        out[f"{key}_p99_ms"] = p99
    return out, violations


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/parts/scheduler.json")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--share-pods", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5, help="whole-GPU rounds of both schedulers")
    ap.add_argument(
        "--bind-workers", type=int, default=None, help="lj-scheduler's bindWorkers (its default)"
    )
    args = ap.parse_args()
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ljbench"))
    cfg = ControlPlaneConfig(controller_manager=True, scheduler=False, kwok=True, verbosity=0)
    results: dict[str, Any] = {}
    with ControlPlane(cfg) as cp:
        api = cp.api_client()
        kube = KubeClient(api)
        log(f"control plane up in {cp.ready_s:.1f}s; creating {args.nodes} nodes x 8 GPUs")
        factory = NodeFactory(api, group="bench")
        specs = [GpuNodeSpec(name=f"gpu-{i:04d}") for i in range(args.nodes)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda s: factory.create_many([s]), specs))
        # the node lifecycle controller lifts the not-ready taint once KWOK reports Ready
        factory.wait_ready([s.name for s in specs], timeout_s=600)
        announce_admission(kube, [s.name for s in specs])
        kube.request(  # the RuntimeClass admission plugin refuses pods naming a missing one
            "POST",
            "/apis/node.k8s.io/v1/runtimeclasses",
            body={
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": RUNTIME_CLASS},
                "handler": RUNTIME_CLASS,
            },
        )
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
        whole, violations = run_whole_rounds(kube, cp, work, lj_cfg, args.pods, args.rounds)
        results.update(whole)

        # 2. lj-scheduler, slices (a fresh process, pods created before it starts)
        rate, text, cpu_s = run_lj(
            kube,
            cp,
            work,
            lj_cfg,
            "bench-share",
            args.share_pods,
            {P.resources.core: "25", P.resources.memory: "25"},
        )
        results["share_pods_per_s"] = rate
        results["cpu_ms_per_share_pod"] = cpu_s * 1000 / args.share_pods
        p50, p99 = histogram_quantiles(
            text, "lj_scheduler_filter_score_duration_seconds", (0.5, 0.99)
        )
        results["share_filter_score_p50_ms"] = p50
        results["share_filter_score_p99_ms"] = p99
        # 3. gangs: a 256-pod gang, and four competing gangs (bench_gang.py)
        results.update(
            run_gang_bench(
                kube, cp, work, lj_cfg, [s.name for s in specs], make_namespace, BindWatch, log
            )
        )
        results["overcommit_violations"] = overcommit_violations(kube) + violations
        api.close()
    out = {k: _rounded(v) for k, v in sorted(results.items())}
    out["nodes"] = args.nodes
    out["whole_gpu_pods"] = args.pods
    out["share_pods"] = args.share_pods
    out["bench_duration_s"] = round(time.monotonic() - began, 1)
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 1)
    out["cpus"] = os.cpu_count() or 0
    out_doc = out
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out_doc, indent=2) + "\n")
    print(f"{'key':40} value")
    for k, v in out.items():
        if isinstance(v, list):
            v = " ".join(str(x) for x in v)
        print(f"{'scheduler.' + k:40} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
