"""Preemption benchmark: time from a high-priority pod's creation to its binding through
preemption.

One control plane (etcd, kube-apiserver, controller manager, KWOK; no default
scheduler), `--nodes` KWOK nodes x 8 GPUs filled by lj-scheduler with
one-GPU pods of a low PriorityClass (grace period 0; the Device Plugins'
records played by bench_scheduler's BindWatch). Then `--samples` pods asking
for 8 GPUs with a high PriorityClass are created one at a time: each evicts
the 8 pods of one node. Each sample is the time from the create call
returning to the watch showing the pod bound; it includes the victims'
deletion and the preemptor's requeue backoff (`podInitialBackoffSeconds`, 1 s).
Then a gang of `--gang` pods of 8 GPUs with the high PriorityClass preempts
as a whole (the pods of `--gang` full nodes): `gang_preemption_s` is the time
from the first member's create call to the last member bound.

Before the fill, one more node (cordoned afterwards) takes a gang of 8 TDM
60 % slices (bench_gang.run_slice_gang): `slice_gang_placed`.

The keys (`preemption_victims_p50_s`, `preemption_victims_p99_s`,
`preemption_samples`, `gang_preemption_s`, `slice_gang_placed`) are merged
into the `--out` part file (by default bench/parts/scheduler.json, which
`make bench` writes first).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.benchpart import write_part

sys.path.insert(0, str(Path(__file__).parent))
from bench_gang import (  # type: ignore[import-not-found]  # a script beside this one
    SLICE_GANG,
    run_slice_gang,
)
from bench_scheduler import (  # type: ignore[import-not-found]  # a script beside this one
    BindWatch,
    announce_admission,
    log,
    make_namespace,
    make_runtime_class,
    pod_body,
)

P = load_protocol()
NS = "bench-preempt"
PRIORITIES = {"bench-low": 10, "bench-high": 1000}


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/parts/scheduler.json")
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--gang", type=int, default=2)
    args = ap.parse_args()
    if args.samples + args.gang > args.nodes:
        ap.error("--samples + --gang must be at most --nodes (each preemption empties one node)")
    work = Path(tempfile.mkdtemp(prefix="ljbench-preempt"))
    cfg = ControlPlaneConfig(controller_manager=True, scheduler=False, kwok=True, verbosity=0)
    samples: list[float] = []
    part: dict[str, float] = {}
    with ControlPlane(cfg) as cp:
        api = cp.api_client()
        kube = KubeClient(api)
        names = [f"gpu-{i:03d}" for i in range(args.nodes)]
        slice_node = "slices"
        factory = NodeFactory(api, group="bench")
        factory.create_many([GpuNodeSpec(name=n) for n in [*names, slice_node]])
        factory.wait_ready([*names, slice_node], timeout_s=300)
        announce_admission(kube, [*names, slice_node])
        make_runtime_class(kube)
        for name, value in PRIORITIES.items():
            kube.request(
                "POST",
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                body={
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                },
            )
        make_namespace(kube, NS)
        lj_cfg = work / "lj-scheduler.yaml"
        lj_cfg.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "scheduler.lingjun.com/v1",
                    "kind": "LjSchedulerConfiguration",
                    "leaderElection": {"leaderElect": False},
                    "profiles": [{"schedulerName": "lj-bench"}],
                }
            )
        )
        watch = BindWatch(kube, NS)
        out_path = work / "lj-scheduler.log"
        with out_path.open("wb") as out:
            lj = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "lj_runtimekit.schedulerframework.cmd.scheduler.main",
                    f"--config={lj_cfg}",
                    f"--kubeconfig={cp.kubeconfig_path}",
                    "--metrics-port=0",
                    "--log-format=text",
                ],
                stdout=out,
                stderr=out,
            )
        try:
            part["slice_gang_placed"] = run_slice_gang(
                kube, NS, slice_node, lambda: watch.times, log
            )
            kube.request(
                "PATCH",
                f"/api/v1/nodes/{slice_node}",
                body={"spec": {"unschedulable": True}},
                content_type="application/merge-patch+json",
            )
            low = args.nodes * 8
            log(f"filling {args.nodes} nodes with {low} low-priority one-GPU pods")

            def create_low(i: int) -> None:
                body = pod_body(f"low-{i:04d}", "lj-bench", {P.resources.gpu: "1"})
                body["spec"]["priorityClassName"] = "bench-low"
                kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)

            with ThreadPoolExecutor(16) as pool:
                list(pool.map(create_low, range(low)))
            deadline = time.monotonic() + 300
            while len(watch.times) < low + SLICE_GANG:
                if time.monotonic() > deadline or lj.poll() is not None:
                    raise RuntimeError(f"low pods not bound; see {out_path}")
                time.sleep(0.1)
            for i in range(args.samples):
                name = f"high-{i:03d}"
                body = pod_body(name, "lj-bench", {P.resources.gpu: "8"})
                body["spec"]["priorityClassName"] = "bench-high"
                kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
                created = time.monotonic()
                deadline = created + 120
                while name not in watch.times:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name} not bound through preemption; see {out_path}")
                    time.sleep(0.01)
                samples.append(watch.times[name] - created)
                log(f"{name} bound {samples[-1]:.2f}s after its creation")
            if args.gang:
                gang = [f"gang-{i}" for i in range(args.gang)]
                created = time.monotonic()
                for name in gang:
                    body = pod_body(name, "lj-bench", {P.resources.gpu: "8"})
                    body["spec"]["priorityClassName"] = "bench-high"
                    body["metadata"]["annotations"] = {
                        P.annotations.gang_group: "gang",
                        P.annotations.gang_min_members: str(args.gang),
                    }
                    kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
                deadline = created + 120
                while not set(gang) <= set(watch.times):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"gang not bound through preemption; see {out_path}")
                    time.sleep(0.01)
                part["gang_preemption_s"] = round(max(watch.times[n] for n in gang) - created, 3)
                log(
                    f"gang of {args.gang} bound {part['gang_preemption_s']:.2f}s after its creation"
                )
        finally:
            watch.stop.set()
            lj.terminate()
            lj.wait(30)
            api.close()
    part["preemption_victims_p50_s"] = round(statistics.median(samples), 3)
    part["preemption_victims_p99_s"] = round(quantile(samples, 0.99), 3)
    part["preemption_samples"] = len(samples)
    write_part(Path(args.out), part, "scheduler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
