"""Controller benchmark: N KWOK nodes labelled at once -> seconds until every enable Job
is done and cleaned up (all Nodes `enabled`, no Job and no pod left), duplicate Jobs
(must be 0) and the Controller's peak RSS. Merges flat numeric JSON into bench/parts/.

    uv run python Controller/bench/bench_controller.py --nodes 500 --out bench/parts/controller.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client as k8s

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory
from lj_runtimekit.testkit.controller import JobWatch, OperatorProcess

NAMESPACE = "lj-bench-controller"
LABEL = "lj_runtimekit_enable"


def count_state(core: k8s.CoreV1Api, group: str, state: str) -> int:
    response = core.list_node(
        label_selector=f"envtest.lj-runtimekit.io/group={group},lj-runtimekit.io/feature-state={state}",
        _preload_content=False,
    )
    return len(json.loads(response.data)["items"])


def leftovers(core: k8s.CoreV1Api, batch: k8s.BatchV1Api) -> int:
    """Jobs + pods left in the namespace, from two one-item list calls (cheap under load)."""
    total = 0
    for lister in (batch.list_namespaced_job, core.list_namespaced_pod):
        page = json.loads(lister(NAMESPACE, limit=1, _preload_content=False).data)
        total += len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)
    return total


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (nearest rank), 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, -(-q * len(ordered) // 100) - 1))], 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=Path("bench/parts/controller.json"))
    args = parser.parse_args()
    n = args.nodes
    work = Path(tempfile.mkdtemp(prefix="lj-bench-controller-"))
    with ControlPlane(ControlPlaneConfig()) as cp:
        api = cp.api_client()
        core, batch = k8s.CoreV1Api(api), k8s.BatchV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        deadline = time.monotonic() + 60
        while True:
            try:
                core.read_namespaced_service_account("default", NAMESPACE)
                break
            except k8s.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        factory = NodeFactory(api, group=NAMESPACE)
        names = factory.create_many(
            GpuNodeSpec(name=f"bench-{i:04d}", enable=False) for i in range(n)
        )
        factory.wait_ready(names, timeout_s=300)
        print(f"{n} KWOK nodes ready", flush=True)

        op = OperatorProcess(
            cp.kubeconfig_path,
            NAMESPACE,
            work / "controller.log",
            "--leader-elect=false",
            f"--workers={args.workers}",
            # Throughput, not the deadline, is measured: on a loaded host a pod can wait
            # minutes for the scheduler and KWOK.
            "--job-active-deadline=3600",
            node_selector=f"envtest.lj-runtimekit.io/group={NAMESPACE}",
        ).start()
        try:
            deadline = time.monotonic() + 60
            while "controller running" not in op.log():
                if not op.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"controller did not start:\n{op.log()[-4000:]}")
                time.sleep(0.2)
            time.sleep(2)  # initial listing done
            start_rss_mb = op.rss_mb()  # imports, watches and the start-up resync done
            with JobWatch(api, NAMESPACE) as watch:
                load_start = os.getloadavg()[0]
                began = time.monotonic()
                labelled_at: dict[str, float] = {}

                def label(name: str) -> None:
                    core.patch_node(name, {"metadata": {"labels": {LABEL: "true"}}})
                    labelled_at[name] = time.monotonic()

                with ThreadPoolExecutor(32) as pool:
                    list(pool.map(label, names))
                labelled_s = time.monotonic() - began
                print(f"labelled {n} nodes in {labelled_s:.1f}s", flush=True)
                done_s = None
                while time.monotonic() - began < args.timeout:
                    left = leftovers(core, batch)
                    enabled = count_state(core, NAMESPACE, "enabled") if left < 50 else -1
                    if enabled == n and left == 0:
                        done_s = time.monotonic() - began
                        break
                    if not op.alive():
                        raise RuntimeError(f"controller exited:\n{op.log()[-4000:]}")
                    print(
                        f"  t={time.monotonic() - began:5.1f}s enabled={enabled} jobs+pods={left}",
                        flush=True,
                    )
                    time.sleep(2)
                time.sleep(2)
            if done_s is None:
                raise RuntimeError(f"not done within {args.timeout}s; log in {op.log_path}")
            create_lag = [
                t - labelled_at[watch.node_of[uid]]
                for uid, t in watch.added_at.items()
                if watch.node_of.get(uid) in labelled_at
            ]
            pipeline = [
                watch.complete_at[uid] - t
                for uid, t in watch.added_at.items()
                if uid in watch.complete_at
            ]
            clean_lag = [
                watch.deleted_at[uid] - t
                for uid, t in watch.complete_at.items()
                if uid in watch.deleted_at
            ]
            duplicates = sum(max(0, len(uids) - 1) for uids in watch.created.values())
            result = {
                "label_500_nodes_done_s" if n == 500 else f"label_{n}_nodes_done_s": round(
                    done_s, 2
                ),
                "done_after_last_label_s": round(done_s - labelled_s, 2),
                "duplicate_jobs": duplicates,
                "rss_mb": round(op.peak_rss_mb(), 1),
                "rss_start_mb": round(start_rss_mb, 1),
                "jobs_created": watch.total_created(),
                # The Controller's own share: label -> Job created, Job Complete -> recorded
                # and deleted; the rest is the Job controller, scheduler and KWOK.
                "label_to_job_created_p50_s": pct(create_lag, 50),
                "label_to_job_created_p99_s": pct(create_lag, 99),
                "job_complete_to_cleaned_p50_s": pct(clean_lag, 50),
                "job_complete_to_cleaned_p99_s": pct(clean_lag, 99),
                "job_created_to_complete_p50_s": pct(pipeline, 50),
                "job_created_to_complete_p99_s": pct(pipeline, 99),
                "max_jobs_per_node_at_once": watch.max_concurrent,
                "label_patch_s": round(labelled_s, 2),
                "nodes": n,
                "workers": args.workers,
                "host_cpus": os.cpu_count() or 0,
                "host_load_1m_start": round(load_start, 1),
                "host_load_1m_end": round(os.getloadavg()[0], 1),
            }
        finally:
            op.stop()
        factory.cleanup()
        api.close()
    merged = json.loads(args.out.read_text()) if args.out.exists() else {}
    merged.update(result)  # keeps the keys of the other Controller bench (lease skew)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
