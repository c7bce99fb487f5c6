"""Sandbox benchmark: the whole path on the bed -> bench/parts/sandbox.json.

Keys: bed_start_s (control plane to every component ready, 4 nodes),
enable_4_nodes_s (label to every node enabled, Jobs cleaned), pod_running_p50_ms /
pod_running_p99_ms (creation to Running through the scheduler, the kubelet shim's
admission and Allocate, for a burst of slice and whole-GPU pods), burst_pods_per_s,
invariant_violations (DESIGN section 4 across the three layers afterwards).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lj_runtimekit.sandbox import Sandbox, SandboxConfig, workload
from lj_runtimekit.sandbox.workload import pod_manifest


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ts(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


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
            began = time.monotonic()
            workload.create_pods(api, ns, burst)
            listed = workload.wait_pods(
                api, ns, [p["metadata"]["name"] for p in burst], timeout_s=300, running=True
            )
            out["burst_pods_per_s"] = round(pods / (time.monotonic() - began), 2)
            latencies = []
            for pod in listed:
                created = _ts(pod["metadata"]["creationTimestamp"])
                ready = next(
                    c["lastTransitionTime"]
                    for c in pod["status"]["conditions"]
                    if c["type"] == "Ready"
                )
                latencies.append((_ts(ready) - created) * 1000)
            out["pod_running_p50_ms"] = round(statistics.median(latencies), 1)
            out["pod_running_p99_ms"] = round(_p(latencies, 0.99), 1)

            def consistent() -> tuple[bool, str]:
                rows, _ = workload.observe(bed, api, [ns])
                unrecorded = [r.name for r in rows if r.allocated is None]
                return not unrecorded, f"no Device Plugin record yet for {unrecorded}"

            workload.wait_until("Device Plugin records", consistent, 60)
            rows, runtime = workload.observe(bed, api, [ns])
            out["invariant_violations"] = float(len(workload.invariant_violations(rows, runtime)))
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
