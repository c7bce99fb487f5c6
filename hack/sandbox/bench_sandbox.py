"""Sandbox benchmark: the whole path on the bed -> bench/parts/sandbox.json.

Keys: bed_start_s (control plane to every component ready, 4 nodes),
enable_4_nodes_s (label to every node enabled, Jobs cleaned), pod_running_p50_ms /
pod_running_p99_ms (create call returned to Running seen by 50 ms polls: the scheduler,
the real kubelet's admission (hollow node) with Allocate, for a burst of slice and
whole-GPU pods), burst_pods_per_s, invariant_violations (the sharing invariant of
docs/architecture.md across the three layers afterwards).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client as k8s_client

from lj_runtimekit.sandbox import Sandbox, SandboxConfig, workload
from lj_runtimekit.sandbox.workload import pod_manifest
from lj_runtimekit.testkit.waits import NotYet, wait_for


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(nodes: int, pods: int) -> dict[str, float]:
    state = Path(tempfile.mkdtemp(prefix="ljbench", dir="/tmp"))
    cfg = SandboxConfig(nodes=nodes, kinds=("tdm-8gpu",), state_dir=state)
    out: dict[str, float] = {}
    with Sandbox(cfg, progress=lambda m: print(f"[bench] {m}", flush=True)) as bed:
        out["bed_start_s"] = round(bed.started_s, 2)
        with bed.api_client() as api:
            names = [n.name for n in bed.nodes]
            began = time.monotonic()
            workload.label_nodes(api, names, bed.protocol.labels.enable, "true")
            workload.wait_feature_state(api, names, "enabled", timeout_s=180)
            out[f"enable_{nodes}_nodes_s"] = round(time.monotonic() - began, 2)
            res = bed.protocol.resources
            ns = "bench"
            workload.ensure_namespace(api, ns)
            burst = [
                pod_manifest(f"s{i}", {"main": {res.core: 25, res.memory: 25}})
                if i % 4
                else pod_manifest(f"w{i}", {"main": {res.gpu: 1}})
                for i in range(pods)
            ]
            created: dict[str, float] = {}
            running: dict[str, float] = {}
            core = k8s_client.CoreV1Api(api)
            began = time.monotonic()
            for pod in burst:
                core.create_namespaced_pod(ns, pod)
                created[pod["metadata"]["name"]] = time.monotonic()
            deadline = began + 300
            while len(running) < len(burst):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(burst) - len(running)} pods not Running in 300s")
                now = time.monotonic()
                for pod in workload.list_pods(api, ns):
                    name = pod["metadata"]["name"]
                    if name not in running and (pod.get("status") or {}).get("phase") == "Running":
                        running[name] = now
                time.sleep(0.05)
            out["burst_pods_per_s"] = round(pods / (max(running.values()) - began), 2)
            latencies = [(running[n] - created[n]) * 1000 for n in running]
            out["pod_running_p50_ms"] = round(statistics.median(latencies), 1)
            out["pod_running_p99_ms"] = round(_p(latencies, 0.99), 1)

            def consistent() -> bool | NotYet:
                rows, _ = workload.observe(bed, api, [ns])
                unrecorded = [r.name for r in rows if r.allocated is None]
                return not unrecorded or NotYet(f"no Device Plugin record yet for {unrecorded}")

            wait_for(consistent, 60, "Device Plugin records")
            rows, runtime = workload.observe(bed, api, [ns])
            problems = workload.invariant_violations(rows, runtime, bed.protocol)
            out["invariant_violations"] = float(len(problems))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/parts/sandbox.json"))
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--pods", type=int, default=64)
    args = parser.parse_args()
    results = run(args.nodes, args.pods)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
