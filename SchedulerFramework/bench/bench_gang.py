"""Gang part of the scheduler benchmark (called by bench_scheduler.py on its cluster).

On the benchmark's KWOK nodes (1000 x 8 GPUs, partly filled by the earlier
runs) labelled with topology (blocks of 32 nodes, switches of 8) and Runtime
v1.15.0:

- gang_256_place_s: a 256-pod gang (one GPU each: 32 nodes x 8 GPUs) is
  created, then a fresh lj-scheduler starts; the time from its cache being
  synced to the last bind (like the throughput runs, pods exist first);
- partial_gangs: four competing gangs of 16 pods x 8 GPUs on 48 dedicated
  nodes (three fit); after the three are bound, gangs with some but not all of
  their minimum bound, over every gang of the run (target 0);
- gang_competing_whole: how many of the four went whole (3 expected).

`slice_gang_placed` (run by bench_preemption.py on its own cluster): a gang
of 8 TDM slices (60 % core, 10 % memory) on one empty 8-GPU node, where two
such slices never share a GPU: 1 when the whole gang is bound, one slice per
GPU, else 0.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import decode_assignment, load_protocol
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import Args as GpuShareArgs
from lj_runtimekit.testkit.invariant import assignment_holdings, sharing_violations

P = load_protocol()
COMPETE_LABEL = "bench.lj-runtimekit.io/compete"
GANG_SIZE = 256
COMPETING = 4
COMPETING_SIZE = 16
SLICE = {P.resources.core: "60", P.resources.memory: "10"}
SLICE_GANG = 8


def label_nodes(kube: KubeClient, names: Sequence[str]) -> list[str]:
    """Topology and Runtime labels on every node; the last 48 become the competition nodes."""
    compete = list(names[-COMPETING_SIZE * 3 :])

    def one(item: tuple[int, str]) -> None:
        i, name = item
        labels = {
            P.labels.topology_block: f"b{i // 32:02d}",
            P.labels.topology_switch: f"s{i // 8:03d}",
            P.labels.runtime_version: "v1.15.0",
        }
        if name in compete:
            labels[P.labels.topology_block] = "compete"
            labels[COMPETE_LABEL] = "true"
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            body={"metadata": {"labels": labels}},
            content_type="application/merge-patch+json",
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, enumerate(names)))
    return compete


def gang_pod(
    name: str,
    group: str,
    size: int,
    gpus: str,
    selector: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A member of gang `group` asking for `gpus` whole GPUs (or `limits`)."""
    spec: dict[str, Any] = {
        "schedulerName": "lj-bench",
        "runtimeClassName": GpuShareArgs.runtime_class_name,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"limits": limits or {P.resources.gpu: gpus}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {
                P.annotations.gang_group: group,
                P.annotations.gang_min_members: str(size),
                P.annotations.gang_timeout_seconds: "120",
            },
        },
        "spec": spec,
    }


def partial_gangs(kube: KubeClient, ns: str) -> tuple[int, dict[str, int]]:
    """(gangs with 0 < bound < minimum, bound members per gang)."""
    pods, _ = kube.list_all(f"/api/v1/namespaces/{ns}/pods")
    bound: dict[str, int] = {}
    minimum: dict[str, int] = {}
    for p in pods:
        ann = p["metadata"].get("annotations") or {}
        group = ann.get(P.annotations.gang_group)
        if group is None:
            continue
        minimum[group] = int(ann[P.annotations.gang_min_members])
        bound[group] = bound.get(group, 0) + bool(p["spec"].get("nodeName"))
    return sum(1 for g, n in bound.items() if 0 < n < minimum[g]), bound


def run_gang_bench(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    config: Path,
    node_names: Sequence[str],
    make_namespace: Callable[[KubeClient, str], None],
    bind_watch: Callable[[KubeClient, str], Any],
    log: Callable[[str], None],
) -> dict[str, float]:
    ns = "bench-gang"
    log(f"gang bench: labelling {len(node_names)} nodes with topology")
    label_nodes(kube, node_names)
    make_namespace(kube, ns)
    log(f"gang bench: creating a {GANG_SIZE}-pod gang (1 GPU each) before lj-scheduler starts")
    created = time.monotonic()

    def create(i: int) -> None:
        body = gang_pod(f"big-{i:03d}", "big", GANG_SIZE, "1")
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(GANG_SIZE)))
    log(f"gang bench: created in {time.monotonic() - created:.1f}s")
    watch = bind_watch(kube, ns)
    out_path = work / "lj-scheduler-gang.log"
    with out_path.open("wb") as out:
        lj = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit.schedulerframework.cmd.scheduler.main",
                f"--config={config}",
                f"--kubeconfig={cp.kubeconfig_path}",
                "--metrics-port=0",
                "--log-format=text",
                "--log-level=info",
            ],
            stdout=out,
            stderr=out,
        )
    results: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 300
        while b"cache synced" not in out_path.read_bytes():
            if time.monotonic() > deadline or lj.poll() is not None:
                raise RuntimeError(f"lj-scheduler did not sync; see {out_path}")
            time.sleep(0.05)
        began = time.monotonic()
        deadline = began + 300
        while len(watch.times) < GANG_SIZE:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(watch.times)}/{GANG_SIZE} gang pods bound")
            time.sleep(0.05)
        results["gang_256_place_s"] = max(watch.times.values()) - began
        log(f"gang bench: placed in {results['gang_256_place_s']:.2f}s")

        log(f"gang bench: {COMPETING} competing gangs of {COMPETING_SIZE} x 8 GPUs on 48 nodes")
        for i in range(COMPETING_SIZE):  # members arrive interleaved
            for g in range(COMPETING):
                body = gang_pod(
                    f"c{g}-{i:02d}", f"c{g}", COMPETING_SIZE, "8", {COMPETE_LABEL: "true"}
                )
                kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
        deadline = time.monotonic() + 300
        while len(watch.times) < GANG_SIZE + 3 * COMPETING_SIZE:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        time.sleep(2.0)  # a fourth gang binding partly would show up now
        partial, bound = partial_gangs(kube, ns)
        results["partial_gangs"] = partial
        results["gang_competing_whole"] = sum(
            1 for g in range(COMPETING) if bound.get(f"c{g}", 0) == COMPETING_SIZE
        )
        log(f"gang bench: partial gangs {partial}, bound per gang {bound}")
    finally:
        watch.stop.set()
        lj.terminate()
        lj.wait(30)
    return results


def run_slice_gang(
    kube: KubeClient,
    ns: str,
    node: str,
    bound: Callable[[], Mapping[str, float]],
    log: Callable[[str], None],
) -> int:
    """`slice_gang_placed`: a gang of 8 60 % slices on the empty 8-GPU `node` (the pods
    select it by hostname); `bound`: the pods of `ns` bound so far (name -> time)."""
    names = [f"slice-{i}" for i in range(SLICE_GANG)]
    for name in names:
        body = gang_pod(name, "slices", SLICE_GANG, "", {"kubernetes.io/hostname": node}, SLICE)
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
    deadline = time.monotonic() + 60
    while not set(names) <= set(bound()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pods = [
        p
        for p in kube.list_all(f"/api/v1/namespaces/{ns}/pods")[0]
        if p["metadata"]["name"] in names and p["spec"].get("nodeName") == node
    ]
    gpus = {
        share.device_id
        for p in pods
        for shares in decode_assignment(
            p["metadata"]["annotations"][P.annotations.assigned_devices]
        ).values()
        for share in shares
    }
    clean = not sharing_violations("slices", assignment_holdings(pods, P))
    placed = int(len(pods) == SLICE_GANG and len(gpus) == SLICE_GANG and clean)
    log(f"slice gang: {len(pods)}/{SLICE_GANG} bound on {len(gpus)} GPU(s); placed={placed}")
    return placed
