"""DRA mode benchmark: NodePrepareResources latency, the plugin's memory, and kube-scheduler's
rate on our ResourceSlices beside its rate on the Device Plugin's extended resource.

One control plane of the DRA mode's release, DRA_VERSION (etcd, kube-apiserver,
kube-controller-manager, KWOK playing only its pod-delete stage, as in bench_scheduler.py; no
default scheduler).

1. prepare: a Node object in DRA mode, the Runtime simulator in process (tdm-8gpu: 8 TDM
   GPUs) on a unix socket and a running `lj-dra-plugin` process for that node (slices
   published, checkpoint and CDI specs in a temporary directory). `--claims` distinct
   ResourceClaims are created in the API server and allocated through their status as
   kube-scheduler writes it (one share per claim, cores 3 % and memory 3 steps, round robin
   over the 8 GPUs); each is then prepared with its own NodePrepareResources call over the
   plugin's DRAPlugin v1 socket, timed at the caller (so every call includes the plugin's
   claim read from the API server, the Runtime's Allocate, the CDI spec and the checkpoint
   write). Then every claim is prepared again (idempotent: the checkpointed answer, the
   Runtime asked again) and unprepared, each timed. The Runtime must hold exactly the
   claims after the prepares and none after the unprepares. `plugin_rss_mb` is the
   plugin's VmRSS after the prepares.
2. kube-scheduler: `--nodes` KWOK nodes, each with the extended resource
   `alibabacloud.com/gpu: 8` and in DRA mode with our ResourceSlices (build_slices,
   applied directly): half with 8 TDM GPUs, half with 8 MIG GPUs of seven 1g.10gb
   instances each; the DeviceClasses without extended-resource names. In each round
   (`--rounds`, order alternating) the stock kube-scheduler (pinned version, the DRA
   gates on, client QPS/burst 5000/10000) places `--pods` pods asking
   `alibabacloud.com/gpu: 1`, and `--pods` pods with one ResourceClaim each from a
   template: half a MIG instance, half a TDM share (cores 5 %, memory 5 steps). A DRA
   run's claims are all created by the controller manager before the scheduler starts.
   Rate = (N-1) / (last bind - first bind), from a watch; the medians over rounds, the
   per-round values and the ratio's distribution-free interval are reported.
   The pod mix avoids kube-scheduler 1.34.4's TDM bug (kubernetes issue 133705: once a TDM
   node's first GPU cannot fit a whole or share request, the node's other GPUs are refused
   too): a MIG request is not affected, and a share of 5 % fits a node's first GPU 20
   times while a round spreads its 250 shares over 500 TDM nodes (a few at most on one),
   so no pod meets the bug and the rate is of scheduling. Each run's pods are deleted
   before the next run.

    uv run python DevicePlugin/bench/bench_dra.py --out bench/parts/dra.json

`--only prepare` (or `scheduler`) runs one part and merges its keys into the part file;
its duration and load keys are prefixed with the part's name.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from subprocess import STDOUT
from typing import Any

import grpc

from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes
from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY, device_name, memory_step
from lj_runtimekit.deviceplugin.internal.dra.publisher import server_minor
from lj_runtimekit.deviceplugin.internal.dra.server import service_socket
from lj_runtimekit.deviceplugin.internal.dra.slices import build_slices, counters_apart
from lj_runtimekit.envtest import kwok
from lj_runtimekit.envtest.controlplane import (
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    dra_gates,
)
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2 as v1
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2_grpc as v1_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET, Simulator
from lj_runtimekit.testkit.benchpart import write_part
from lj_runtimekit.testkit.dra import (
    RESOURCE_API,
    claim_pod,
    claim_template,
    exactly,
    synthetic_gpus,
)
from lj_runtimekit.testkit.procfs import status_mb
from lj_runtimekit.testkit.waits import NotYet, wait_for

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "SchedulerFramework" / "bench"))
from bench_deviceplugin import cpu_seconds, pct  # type: ignore[import-not-found]  # beside this one
from bench_scheduler import (  # type: ignore[import-not-found]  # the scheduler bench's parts
    BindWatch,
    delete_pods,
    log,
    make_namespace,
    median_interval,
    prioritise_node_simulator,
    start_kube_scheduler,
)

P = load_protocol()
DRIVER = P.dra.driver
SHARE_CLASS = P.dra.share_class("gpu")
PLUGIN_NODE = "dra-bench"
SHARE_PERCENT = 3
"""Cores % and memory steps of each prepared claim: 200 claims over 8 GPUs hold 75 %."""
SCHED_SHARE_PERCENT = 5
"""Cores % and memory steps of a scheduled share: even 20 on a node's first GPU fit."""


# 1. NodePrepareResources against the running plugin


def share_result(device: str, step_bytes: int, percent: int) -> dict[str, Any]:
    """One allocation result as kube-scheduler writes it for a TDM share."""
    return {
        "request": "gpu",
        "driver": DRIVER,
        "pool": PLUGIN_NODE,
        "device": device,
        "consumedCapacity": {CORES: str(percent), MEMORY: str(percent * step_bytes)},
        "shareID": str(uuid.uuid4()),
    }


def allocated_claim(kube: KubeClient, ns: str, name: str, result: dict[str, Any]) -> v1.Claim:
    """Create a claim and allocate it through its status; the claim as the kubelet names it."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": SHARE_CLASS}}]}
        },
    }
    path = f"{RESOURCE_API}/namespaces/{ns}/resourceclaims"
    claim = kube.request("POST", path, body=body)
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    claim = kube.request("PUT", f"{path}/{name}/status", body=claim)
    if not claim["status"]["allocation"]["devices"]["results"][0].get("consumedCapacity"):
        raise SystemExit("the API server dropped consumedCapacity: DRAConsumableCapacity is off")
    return v1.Claim(namespace=ns, name=name, uid=claim["metadata"]["uid"])


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    """Milliseconds one awaited call took."""
    t0 = time.perf_counter()
    await call()
    return (time.perf_counter() - t0) * 1000


async def prepare_run(kube: KubeClient, kubeconfig: Path, work: Path, n: int) -> dict[str, Any]:
    """Time NodePrepareResources (new and repeated) and NodeUnprepareResources of `n` claims."""
    sim = Simulator(load_node_file(EXAMPLE_NODES / "tdm-8gpu.yaml"), work / "sim")
    await sim.start()
    runtime = RuntimeClient(work / "sim", RUNTIME_SOCKET, RetryPolicy(attempts=1))
    kubelet_dir = work / "kubelet"
    argv = [
        shutil.which("lj-dra-plugin") or "lj-dra-plugin",
        "--log-level=WARNING",
        f"--node-name={PLUGIN_NODE}",
        f"--kubeconfig={kubeconfig}",
        f"--runtime-socket={work / 'sim' / RUNTIME_SOCKET}",
        f"--kubelet-dir={kubelet_dir}",
        f"--cdi-dir={work / 'cdi'}",
    ]
    with (work / "plugin.log").open("ab") as out:
        plugin = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=STDOUT)
    try:
        socket = service_socket(kubelet_dir, DRIVER)
        slices = f"{RESOURCE_API}/resourceslices"
        query = {"fieldSelector": f"spec.nodeName={PLUGIN_NODE}"}

        def published() -> int | NotYet:
            if plugin.returncode is not None:
                raise SystemExit(f"lj-dra-plugin exited: {(work / 'plugin.log').read_text()}")
            items = kube.list_all(slices, query)[0]
            count = sum(len(s["spec"].get("devices") or ()) for s in items)
            return count if count and socket.exists() else NotYet(f"{count} devices published")

        published_devices = await asyncio.to_thread(
            wait_for, published, 60, "the plugin's slices and socket"
        )
        devices = list(await runtime.list_devices())
        ns = "dra-prepare"
        make_namespace(kube, ns)
        with ThreadPoolExecutor(8) as pool:
            claims = list(
                pool.map(
                    lambda i: allocated_claim(
                        kube,
                        ns,
                        f"c{i}",
                        share_result(
                            device_name(devices[i % len(devices)]),
                            memory_step(devices[i % len(devices)]),
                            SHARE_PERCENT,
                        ),
                    ),
                    range(n),
                )
            )
        log(f"{n} claims allocated; preparing")
        cpu0 = cpu_seconds(plugin.pid)
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            stub = v1_grpc.DRAPluginStub(channel)

            async def prepare(claim: v1.Claim) -> None:
                answer = await stub.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=[claim])
                )
                got = answer.claims[claim.uid]
                if got.error or len(got.devices) != 1:
                    raise SystemExit(f"claim {claim.name} not prepared: {got}")

            async def unprepare(claim: v1.Claim) -> None:
                answer = await stub.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=[claim])
                )
                if answer.claims[claim.uid].error:
                    raise SystemExit(f"claim {claim.name}: {answer.claims[claim.uid].error}")

            first = [await timed(partial(prepare, c)) for c in claims]
            cpu_per_prepare = (cpu_seconds(plugin.pid) - cpu0) * 1000 / n
            held = [a for a in await runtime.list_allocations() if a.claim_uid]
            if sorted(a.claim_uid for a in held) != sorted(c.uid for c in claims):
                raise SystemExit(f"the Runtime holds {len(held)} claims, not the {n} prepared")
            again = [await timed(partial(prepare, c)) for c in claims]
            rss = status_mb(plugin.pid)
            release = [await timed(partial(unprepare, c)) for c in claims]
        left = [a for a in await runtime.list_allocations() if a.claim_uid]
        if left:
            raise SystemExit(f"the Runtime still holds {len(left)} claims after unprepare")
    finally:
        plugin.terminate()
        await asyncio.wait_for(plugin.wait(), 30)
        await runtime.close()
        await sim.stop(0)
    return {
        "prepare_p50_ms": round(statistics.median(first), 3),
        "prepare_p99_ms": round(pct(first, 0.99), 3),
        "prepare_max_ms": round(max(first), 3),
        "prepare_claims": n,
        "plugin_cpu_ms_per_prepare": round(cpu_per_prepare, 3),
        "prepare_again_p50_ms": round(statistics.median(again), 3),
        "prepare_again_p99_ms": round(pct(again, 0.99), 3),
        "unprepare_p50_ms": round(statistics.median(release), 3),
        "unprepare_p99_ms": round(pct(release, 0.99), 3),
        "plugin_rss_mb": round(rss, 1),
        "plugin_node_devices_published": published_devices,
    }


# 2. kube-scheduler: ResourceClaims on our slices against the extended resource


def publish_nodes(kube: KubeClient, api: Any, nodes: int) -> None:
    """`nodes` KWOK nodes with the extended resource, in DRA mode, half TDM and half MIG,
    their slices applied directly, and the DeviceClasses."""
    factory = NodeFactory(api, group="bench")
    labels = {P.labels.device_api: DRA_MODE}
    specs = [GpuNodeSpec(name=f"gpu-{i:04d}", labels=labels) for i in range(nodes)]
    apart = counters_apart(server_minor(kube.request("GET", "/version")))
    tdm = synthetic_gpus(8, pb.DEVICE_MODE_TDM)
    mig = synthetic_gpus(8, pb.DEVICE_MODE_MIG, mig_per_gpu=7)

    def one(i: int) -> None:
        spec = specs[i]
        factory.create_many([spec])
        uid = kube.request("GET", f"/api/v1/nodes/{spec.name}")["metadata"]["uid"]
        inventory = tdm if i % 2 == 0 else mig
        for obj in build_slices(
            inventory, node_name=spec.name, protocol=P, generation=1, node_uid=uid, apart=apart
        ):
            kube.request("POST", f"{RESOURCE_API}/resourceslices", obj)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(nodes)))
    for obj in device_classes(P, extended_resources=False):
        kube.request("POST", f"{RESOURCE_API}/deviceclasses", obj)
    factory.wait_ready([s.name for s in specs], timeout_s=max(600, nodes * 0.3))


def create_pods(kube: KubeClient, ns: str, bodies: Sequence[Mapping[str, Any]]) -> None:
    """POST the pods, 16 at a time."""
    path = f"/api/v1/namespaces/{ns}/pods"
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda body: kube.request("POST", path, body=body), bodies))


def extended_pods(ns: str, n: int) -> list[dict[str, Any]]:
    """`n` pods asking one GPU of the Device Plugin's extended resource."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{i}"},
            "spec": {
                "schedulerName": ns,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {P.resources.gpu: "1"}},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
        for i in range(n)
    ]


def claim_pods(kube: KubeClient, ns: str, n: int, step_bytes: int) -> list[dict[str, Any]]:
    """The two templates of a DRA run and `n` pods using them, half each."""
    share = {CORES: str(SCHED_SHARE_PERCENT), MEMORY: str(SCHED_SHARE_PERCENT * step_bytes)}
    for name, request in (
        ("mig", exactly("m", P.dra.mig_class)),
        ("share", exactly("s", P.dra.share_class("gpu"), capacity=share)),
    ):
        kube.request(
            "POST",
            f"{RESOURCE_API}/namespaces/{ns}/resourceclaimtemplates",
            claim_template(name, [request], ns),
        )
    pods = []
    for i in range(n):
        template = "mig" if i % 2 == 0 else "share"
        body = claim_pod(f"p{i}", {"gpu": template}, containers=({"main": ("gpu",)},), namespace=ns)
        body["spec"]["schedulerName"] = ns
        body["spec"]["terminationGracePeriodSeconds"] = 0
        pods.append(body)
    return pods


def scheduler_run(
    kube: KubeClient, cp: ControlPlane, work: Path, ns: str, pods: list[dict[str, Any]]
) -> float:
    """The stock kube-scheduler (profile `ns`) places the namespace's pods: pods/s."""
    n = len(pods)
    create_pods(kube, ns, pods)
    if any(p["spec"].get("resourceClaims") for p in pods):
        claims = f"{RESOURCE_API}/namespaces/{ns}/resourceclaims"
        wait_for(
            lambda: len(kube.list_all(claims)[0]) >= n or NotYet("claims"),
            300,
            f"{n} claims of {ns} created",
        )
    watch = BindWatch(kube, ns)
    scheduler, _ = start_kube_scheduler(cp, work, ns, None)
    try:
        rate = float(watch.wait(n, 600))
    finally:
        scheduler.stop()
    log(f"{ns}: {rate:.1f} pods/s")
    return rate


def scheduler_rounds(
    kube: KubeClient, cp: ControlPlane, work: Path, n: int, rounds: int
) -> dict[str, Any]:
    """Alternating runs of both kinds of pods; medians, per-round values, the interval."""
    step = memory_step(synthetic_gpus(1, pb.DEVICE_MODE_TDM)[0])
    rates: dict[str, list[float]] = {"dra": [], "extended": []}
    for r in range(rounds):
        for kind in ("dra", "extended") if r % 2 == 0 else ("extended", "dra"):
            ns = f"bench-{kind}-{r}"
            make_namespace(kube, ns)
            pods = claim_pods(kube, ns, n, step) if kind == "dra" else extended_pods(ns, n)
            rates[kind].append(scheduler_run(kube, cp, work, ns, pods))
            delete_pods(kube, ns)
    ratios = [a / b for a, b in zip(rates["dra"], rates["extended"], strict=True)]
    low, high, coverage = median_interval(ratios)
    return {
        "kube_scheduler_pods_per_s": round(statistics.median(rates["dra"]), 2),
        "kube_scheduler_pods_per_s_per_round": [round(x, 2) for x in rates["dra"]],
        "kube_scheduler_extended_resource_pods_per_s": round(
            statistics.median(rates["extended"]), 2
        ),
        "kube_scheduler_extended_resource_pods_per_s_per_round": [
            round(x, 2) for x in rates["extended"]
        ],
        "kube_scheduler_ratio_vs_extended_resources": round(statistics.median(ratios), 3),
        "kube_scheduler_ratio_per_round": [round(x, 3) for x in ratios],
        "kube_scheduler_ratio_interval": [round(low, 3), round(high, 3)],
        "kube_scheduler_ratio_interval_coverage": round(coverage, 3),
        "kube_scheduler_rounds": rounds,
        "kube_scheduler_pods": n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/parts/dra.json"))
    parser.add_argument("--claims", type=int, default=200, help="claims prepared")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=500, help="pods per scheduler run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only",
        choices=("prepare", "scheduler"),
        help="run one part; the part file keeps the other part's keys",
    )
    args = parser.parse_args()
    began = time.monotonic()
    load_at_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="ljdra", dir="/tmp"))
    cfg = ControlPlaneConfig(
        scheduler=False,
        verbosity=0,
        version=DRA_VERSION,
        feature_gates=dra_gates(DRA_VERSION),
        kwok_stages=kwok.stages_named("pod-delete"),
    )
    results: dict[str, Any] = {}
    try:
        with ControlPlane(cfg) as cp:
            api = cp.api_client()
            kube = KubeClient(api)
            prioritise_node_simulator(cp)
            NodeFactory(api, group="dra").create(
                PLUGIN_NODE, gpus=0, labels={P.labels.device_api: DRA_MODE}, wait=False
            )
            if args.only != "scheduler":
                results.update(
                    asyncio.run(prepare_run(kube, cp.kubeconfig_path, work, args.claims))
                )
                log(f"prepare: {results}")
            if args.only != "prepare":
                log(f"creating {args.nodes} nodes with slices")
                publish_nodes(kube, api, args.nodes)
                results.update(scheduler_rounds(kube, cp, work, args.pods, args.rounds))
                results["nodes"] = args.nodes
            api.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    prefix = f"{args.only}_" if args.only else ""
    results.update(
        {
            f"{prefix}bench_duration_s": round(time.monotonic() - began, 1),
            f"{prefix}load_avg_1m_at_start": round(load_at_start, 1),
            f"{prefix}load_avg_1m_at_end": round(os.getloadavg()[0], 1),
            "cpus": os.cpu_count() or 0,
        }
    )
    write_part(args.out, results, "dra")
    return 0


if __name__ == "__main__":
    sys.exit(main())
