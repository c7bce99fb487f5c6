"""Kueue in front of lj-scheduler -> bench/parts/kueue.json, and the bed the e2e test uses.

The bed (`kueue_bed`): an envtest control plane without kube-scheduler, KWOK nodes with
the device inventory annotation (H200 nodes, and A100 nodes that the queue's
ResourceFlavor does not select), Kueue's manager (its pod integration) with the queue of
docs/examples/kueue-gpu-queue.yaml applied as it is, and lj-scheduler as `lj-scheduler`.

The benchmark: 100 pods queued while the ClusterQueue is held (`stopPolicy: Hold`), then
released at once, far over its quota (8 whole GPUs, slices worth 4 GPUs): 10 pod groups of
4 one-GPU pods (a Kueue pod group and an lj-scheduler gang each), 40 one-GPU pods and 20
half-GPU slice pods. Every workload whose pods are all bound is deleted, which frees its
quota for the next ones: Kueue admits them in waves. A watch of the pods stamps when each
pod's gate went and when it was bound. Keys:

- admitted_to_bound_p50_s / _p99_s / _max_s: gate lifted (Kueue's admission) to bound;
- partial_workloads: pod groups seen with a member bound while another still waited at
  the gate, or not all bound SETTLE_S after their first member was: must be 0;
- stuck_pods: pods admitted but not bound within SETTLE_S (or not admitted at the end);
- pods, workloads, bench_kueue_s (queue released to last workload bound), host_cpus,
  load_avg_1m_start / load_avg_1m_end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from lj_runtimekit.envtest import NodeFactory, find_tools
from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.benchpart import write_part
from lj_runtimekit.testkit.kueue import (
    API_VERSION,
    GROUP,
    POD_GROUP_COUNT_ANNOTATION,
    POD_GROUP_LABEL,
    QUEUE_LABEL,
    Kueue,
    PodTimeline,
)
from lj_runtimekit.testkit.scheduler.process import (
    SchedulerProcess,
    annotate_inventory,
    pod_manifest,
)
from lj_runtimekit.testkit.waits import wait_for

PROTOCOL = load_protocol()
ROOT = Path(__file__).resolve().parents[2]
QUEUE_YAML = ROOT / "docs" / "examples" / "kueue-gpu-queue.yaml"
NAMESPACE = "gpu-team"
QUEUE = "gpu"
"""The namespace and the LocalQueue and ClusterQueue names of QUEUE_YAML."""
FLAVOR_MODEL = "H200"
"""The device model the ResourceFlavor of QUEUE_YAML selects (its nodeLabels)."""
OTHER_MODEL = "A100"
SCHEDULER = "lj-scheduler"
SETTLE_S = 30.0


@dataclass
class KueueBed:
    """The bed's parts; set `failed` to keep the control plane's logs."""

    plane: ControlPlane
    api: k8s_client.ApiClient
    kueue: Kueue
    scheduler: SchedulerProcess
    flavor_nodes: list[str]
    other_nodes: list[str]
    failed: bool = field(default=False)

    @property
    def core(self) -> k8s_client.CoreV1Api:
        return k8s_client.CoreV1Api(self.api)

    def check_running(self) -> None:
        """Raises when Kueue or lj-scheduler has exited (with the log's tail)."""
        self.kueue.check_running()
        proc = self.scheduler.proc
        if proc is None or proc.poll() is not None:
            tail = self.scheduler.text()[-3000:]
            raise RuntimeError(f"lj-scheduler exited; last lines of its log:\n{tail}")


def queued_pod(
    name: str, limits: Mapping[str, str], group: tuple[str, int] | None = None
) -> dict[str, Any]:
    """A pod for the queue of QUEUE_YAML placed by lj-scheduler; `group`: (name, size) of
    the pod group it is in, which is both a Kueue pod group and an lj-scheduler gang."""
    ann = PROTOCOL.annotations
    annotations: dict[str, str] = {}
    labels = {QUEUE_LABEL: QUEUE}
    if group is not None:
        labels[POD_GROUP_LABEL] = group[0]
        annotations[POD_GROUP_COUNT_ANNOTATION] = str(group[1])
        annotations[ann.gang_group] = group[0]
        annotations[ann.gang_min_members] = str(group[1])
    manifest = pod_manifest(name, SCHEDULER, {}, dict(limits), annotations=annotations)
    manifest["metadata"]["labels"] = labels
    manifest["spec"]["terminationGracePeriodSeconds"] = 0
    return manifest


@contextmanager
def kueue_bed(
    kueue_binary: Path, flavor_nodes: int = 2, other_nodes: int = 1
) -> Iterator[KueueBed]:
    """The bed of the module docstring, torn down afterwards."""
    plane = ControlPlane(ControlPlaneConfig(scheduler=False)).start()
    api = plane.api_client()
    failed = True
    try:
        k8s_client.NodeV1Api(api).create_runtime_class(
            {"metadata": {"name": "lj-runtime"}, "handler": "lj-runtime"}
        )
        factory = NodeFactory(api, group="kueue")
        flavor = [f"h200-{i}" for i in range(flavor_nodes)]
        other = [f"a100-{i}" for i in range(other_nodes)]
        for name in flavor:
            factory.create(name, wait=False, device_model=FLAVOR_MODEL)
        for name in other:
            factory.create(name, wait=False, device_model=OTHER_MODEL)
        factory.wait_ready([*flavor, *other])
        core = k8s_client.CoreV1Api(api)
        for name in (*flavor, *other):
            annotate_inventory(core, name)
        with Kueue(plane, kueue_binary) as kueue:
            kueue.apply(QUEUE_YAML)
            kueue.manage(NAMESPACE)
            kueue.wait_local_queue_active(NAMESPACE, QUEUE)
            wait_for(
                lambda: (
                    core.list_namespaced_service_account(
                        NAMESPACE, field_selector="metadata.name=default"
                    ).items
                ),
                30,
                f"ServiceAccount default in {NAMESPACE}",
            )
            scheduler = SchedulerProcess(plane.kubeconfig_path, SCHEDULER).start()
            bed = KueueBed(plane, api, kueue, scheduler, flavor, other)
            try:
                yield bed
                failed = bed.failed
            finally:
                scheduler.stop()
    finally:
        api.close()
        plane.stop(failed=failed)


@dataclass
class _Workload:
    pods: list[str]
    deleted: bool = False


def _workloads() -> dict[str, tuple[list[str], dict[str, str], int]]:
    """Workload name -> (pod names, each pod's limits, group size or 0 for a lone pod)."""
    gpu, core, memory = PROTOCOL.resources.gpu, PROTOCOL.resources.core, PROTOCOL.resources.memory
    out: dict[str, tuple[list[str], dict[str, str], int]] = {}
    for i in range(10):
        out[f"gang-{i}"] = ([f"gang-{i}-{m}" for m in range(4)], {gpu: "1"}, 4)
    for i in range(40):
        out[f"whole-{i}"] = ([f"whole-{i}"], {gpu: "1"}, 0)
    for i in range(20):
        out[f"slice-{i}"] = ([f"slice-{i}"], {core: "50", memory: "50"}, 0)
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(bed: KueueBed, timeout_s: float = 600) -> dict[str, Any]:
    """The benchmark of the module docstring on `bed`; its keys."""
    specs = _workloads()
    workloads = {name: _Workload(pods) for name, (pods, _, _) in specs.items()}
    partial: set[str] = set()
    stuck: set[str] = set()
    custom = k8s_client.CustomObjectsApi(bed.api)

    def hold(policy: str) -> None:
        body = {"spec": {"stopPolicy": policy}}
        custom.patch_cluster_custom_object(GROUP, API_VERSION, "clusterqueues", QUEUE, body)

    def queued() -> int:
        listed = custom.list_namespaced_custom_object(GROUP, API_VERSION, NAMESPACE, "workloads")
        return len(listed["items"])

    with PodTimeline(bed.api, NAMESPACE) as timeline:
        hold("Hold")
        for name, (pods, limits, size) in specs.items():
            group = (name, size) if size else None
            for pod in pods:
                bed.core.create_namespaced_pod(NAMESPACE, queued_pod(pod, limits, group))
        wait_for(lambda: queued() == len(specs), 60, "a Workload for every workload")
        start = time.monotonic()
        hold("None")
        deadline = start + timeout_s
        while not all(w.deleted for w in workloads.values()) and time.monotonic() < deadline:
            bed.check_running()
            ungated, bound, _ = timeline.snapshot()
            now = time.monotonic()
            for pod, at in ungated.items():
                if pod not in bound and now - at > SETTLE_S:
                    stuck.add(pod)
            for name, w in workloads.items():
                if w.deleted:
                    continue
                times = [bound[p] for p in w.pods if p in bound]
                if len(times) == len(w.pods):
                    for pod in w.pods:
                        bed.core.delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)
                    w.deleted = True
                elif times and now - min(times) > SETTLE_S:
                    partial.add(name)
            time.sleep(0.1)
        ungated, bound, _ = timeline.snapshot()
        partial |= timeline.partial_groups
        pods = [p for w in workloads.values() for p in w.pods]
        stuck |= {p for p in pods if p not in bound}
        by_pod = {p: bound[p] - ungated[p] for p in pods if p in bound and p in ungated}
        latencies = list(by_pod.values())
        slowest = sorted(by_pod, key=by_pod.__getitem__)[-5:]
        print(f"[bench] slowest: {', '.join(f'{p} {by_pod[p]:.2f}s' for p in slowest)}")
        last = max(bound.values()) if bound else time.monotonic()
    if not latencies:
        raise RuntimeError(f"no pod was bound; lj-scheduler's log:\n{bed.scheduler.text()[-3000:]}")
    return {
        "pods": len(pods),
        "workloads": len(workloads),
        "admitted_to_bound_p50_s": round(_p(latencies, 0.5), 3),
        "admitted_to_bound_p99_s": round(_p(latencies, 0.99), 3),
        "admitted_to_bound_max_s": round(max(latencies), 3),
        "partial_workloads": len(partial),
        "stuck_pods": len(stuck),
        "bench_kueue_s": round(last - start, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "parts" / "kueue.json")
    args = parser.parse_args()
    binary = find_tools(("kueue",))["kueue"]
    results: dict[str, Any] = {
        "host_cpus": os.cpu_count(),
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
    }
    print("[bench] Kueue + lj-scheduler bed", flush=True)
    with kueue_bed(binary) as bed:
        results |= run(bed)
        bed.failed = bool(results["partial_workloads"] or results["stuck_pods"])
    results["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    write_part(args.out, results, "kueue")
    return 1 if results["partial_workloads"] else 0


if __name__ == "__main__":
    sys.exit(main())
