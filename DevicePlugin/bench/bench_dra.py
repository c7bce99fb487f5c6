"""DRA mode benchmark: NodePrepareResources latency, the plugin's memory, kube-scheduler's
rate on our ResourceSlices beside its rate on the Device Plugin's extended resource, and
lj-scheduler's rate on those slices beside kube-scheduler's, with gangs.

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
3. lj-scheduler (`--only lj-scheduler`): on the same nodes and slices, lj-scheduler (a
   subprocess with its default plugins, DynamicResources and Coscheduling among them, the
   kube-scheduler's client QPS/burst) against the stock kube-scheduler on the same pods: one
   ResourceClaim each from a template asking one whole GPU of the driver's class (the TDM
   nodes' 4000 GPUs at 1000 nodes). In each round (`--lj-rounds`, order alternating) each
   scheduler is started with a profile of its own and warmed up by one pod bound in a
   namespace of its own, then `--lj-pods` pods are created while it runs: rate = pods /
   (last bind - first create), the claims made by the controller manager inside that time
   for both; per-pod create-to-bind latency (p50/p99 over the rounds). After the last bind
   every allocated claim of the cluster is checked (`overcommit_violations`: a whole device
   held by two claims, or shares over a device's capacity); then the scheduler stops, the pods
   are deleted and the run waits until their claims are deallocated and gone. Only one
   scheduler's pods exist at a time. The ratio (ours / theirs per round) is the median over
   rounds with its distribution-free interval. Then a warm lj-scheduler places a gang of
   `--gang` such pods (gang annotations; creation to the last bind, `gang_<n>_place_s`,
   absent when it did not complete within GANG_TIMEOUT_S + 60 s, `gang_<n>_bound` beside
   it, `gang_<n>_create_s` the span of its POSTs; its timeline from a claim watch:
   `gang_<n>_claims_made_s`, `_first_allocated_s`, `_first_bound_s`), and a gang of 17 held
   to two TDM nodes
   (16 GPUs), which cannot fit: it is watched until every member was refused, and none may
   be bound or have its claim allocated meanwhile (`gang_unfit_*`); `partial_gangs` counts
   gangs with some but not all members bound. `--profile DIR` runs lj-scheduler under
   cProfile (bench_scheduler.py's).

    uv run python DevicePlugin/bench/bench_dra.py --out bench/parts/dra.json

`--only prepare` (or `scheduler`, `lj-scheduler`) runs one part and merges its keys into the
part file; its duration and load keys are prefixed with the part's name (`lj_scheduler_`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from subprocess import STDOUT
from typing import Any

import grpc
import yaml

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
    allocated_shares,
    claim_pod,
    claim_template,
    exactly,
    synthetic_gpus,
)
from lj_runtimekit.testkit.invariant import sharing_violations
from lj_runtimekit.testkit.procfs import status_mb
from lj_runtimekit.testkit.waits import NotYet, wait_for

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "SchedulerFramework" / "bench"))
import bench_scheduler  # type: ignore[import-not-found]  # the scheduler bench (its profiling)
from bench_deviceplugin import cpu_seconds, pct  # type: ignore[import-not-found]  # beside this one
from bench_gang import partial_gangs  # type: ignore[import-not-found]  # the scheduler bench's gangs
from bench_scheduler import (  # the scheduler bench's parts
    BURST,
    QPS,
    BindWatch,
    delete_pods,
    follow_watch,
    log,
    make_namespace,
    median_interval,
    prioritise_node_simulator,
    start_kube_scheduler,
    start_lj,
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


def node_inventories(nodes: int) -> dict[str, list[pb.Device]]:
    """The bench's nodes, `gpu-0000` on: node name -> the devices its slices publish (8 TDM
    GPUs on the even nodes, 8 MIG GPUs of seven 1g.10gb instances on the odd ones)."""
    tdm = synthetic_gpus(8, pb.DEVICE_MODE_TDM)
    mig = synthetic_gpus(8, pb.DEVICE_MODE_MIG, mig_per_gpu=7)
    return {f"gpu-{i:04d}": tdm if i % 2 == 0 else mig for i in range(nodes)}


def publish_nodes(kube: KubeClient, api: Any, nodes: int) -> None:
    """`nodes` KWOK nodes with the extended resource, in DRA mode, half TDM and half MIG,
    their slices applied directly, and the DeviceClasses."""
    factory = NodeFactory(api, group="bench")
    labels = {P.labels.device_api: DRA_MODE}
    inventories = node_inventories(nodes)
    specs = [GpuNodeSpec(name=name, labels=labels) for name in inventories]
    apart = counters_apart(server_minor(kube.request("GET", "/version")))

    def one(i: int) -> None:
        spec = specs[i]
        factory.create_many([spec])
        uid = kube.request("GET", f"/api/v1/nodes/{spec.name}")["metadata"]["uid"]
        for obj in build_slices(
            inventories[spec.name],
            node_name=spec.name,
            protocol=P,
            generation=1,
            node_uid=uid,
            apart=apart,
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


# 3. lj-scheduler's DRA allocation beside kube-scheduler's, one whole GPU per pod

WHOLE_CLASS = P.dra.whole_class("gpu")
WHOLE_TEMPLATE = "whole"
GANG_TIMEOUT_S = 120
UNFIT_NODES = ("gpu-0000", "gpu-0002")
"""Two TDM nodes (16 whole GPUs) the gang that cannot fit is held to, one member more."""
UNFIT_TIMEOUT_S = 15
WAITING = (
    "to be made from its template",
    "waiting for the rest",
    "waiting for other members' ResourceClaims",
)
"""lj-scheduler's reasons while a pod's claim (or another member's) is not made yet or its
gang not all created: a wait, not the gang's refusal."""


def whole_space(kube: KubeClient, ns: str) -> None:
    """A namespace with the template of one whole GPU of the driver's class."""
    make_namespace(kube, ns)
    kube.request(
        "POST",
        f"{RESOURCE_API}/namespaces/{ns}/resourceclaimtemplates",
        claim_template(WHOLE_TEMPLATE, [exactly("gpu", WHOLE_CLASS)], ns),
    )


def whole_pod(
    name: str,
    ns: str,
    scheduler: str,
    annotations: Mapping[str, str] | None = None,
    nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """A pod with one claim from the whole-GPU template, for `scheduler`; `nodes` holds it
    to those nodes (required node affinity)."""
    body = claim_pod(
        name,
        {"gpu": WHOLE_TEMPLATE},
        containers=({"main": ("gpu",)},),
        namespace=ns,
        scheduler_name=scheduler,
    )
    body["spec"]["terminationGracePeriodSeconds"] = 0
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    if nodes:
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}
        required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
        body["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
    return body


def create_timed(
    kube: KubeClient, ns: str, bodies: Sequence[Mapping[str, Any]]
) -> dict[str, float]:
    """POST the pods, 16 at a time: pod name -> when its POST was sent (monotonic)."""
    path = f"/api/v1/namespaces/{ns}/pods"
    sent: dict[str, float] = {}

    def one(body: Mapping[str, Any]) -> None:
        sent[body["metadata"]["name"]] = time.monotonic()
        kube.request("POST", path, body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, bodies))
    return sent


def lj_config(work: Path, name: str) -> Path:
    """lj-scheduler's configuration: one profile `name` (its default plugins, DynamicResources
    and Coscheduling among them), the kube-scheduler's client QPS/burst."""
    path = work / f"lj-scheduler-{name}.yaml"
    doc = {
        "apiVersion": "scheduler.lingjun.com/v1",
        "kind": "LjSchedulerConfiguration",
        "clientConnection": {"qps": QPS, "burst": BURST},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def start_placer(which: str, cp: ControlPlane, work: Path, name: str) -> Callable[[], None]:
    """Start lj-scheduler (`lj`) or the stock kube-scheduler (`kube`) with profile `name`; the
    function that stops it."""
    if which == "kube":
        ks, _ = start_kube_scheduler(cp, work, name, None)

        def stop_kube() -> None:
            ks.stop()

        return stop_kube
    lj, _ = start_lj(cp, work, lj_config(work, name), name)

    def stop_lj() -> None:
        lj.terminate()
        lj.wait(30)

    return stop_lj


def warm_up(kube: KubeClient, scheduler: str) -> None:
    """One pod of `scheduler` bound in a namespace of its own: the scheduler's caches are
    synced before a timed run (its pods and claims stay until `clear`)."""
    ns = f"{scheduler}-warm"
    whole_space(kube, ns)
    create_timed(kube, ns, [whole_pod("warm", ns, scheduler)])
    path = f"/api/v1/namespaces/{ns}/pods/warm"
    wait_for(lambda: kube.request("GET", path)["spec"].get("nodeName"), 600, f"{ns}/warm bound")


def clear(kube: KubeClient, ns: str) -> None:
    """Delete the namespace's pods and wait until the controller manager has deallocated and
    deleted their claims: every device they held is free again."""
    delete_pods(kube, ns)
    path = f"{RESOURCE_API}/namespaces/{ns}/resourceclaims"
    wait_for(
        lambda: (not (left := kube.list_all(path)[0])) or NotYet(f"{len(left)} claims left"),
        300,
        f"claims of {ns} deleted",
    )


def claim_violations(kube: KubeClient, inventories: Mapping[str, Sequence[pb.Device]]) -> list[str]:
    """Breaches of the sharing invariant across every allocated claim on the bench's nodes
    (`inventories`; the prepare part's claims are on a node of their own): a whole device
    held by two claims, or shares over a device's cores or memory."""
    items, _ = kube.list_all(f"{RESOURCE_API}/resourceclaims")
    holdings = [
        (pool, f"{claim['metadata']['namespace']}/{claim['metadata']['name']}", share)
        for claim in items
        if (allocation := claim.get("status", {}).get("allocation"))
        and all(r["pool"] in inventories for r in allocation["devices"]["results"])
        for pool, _, share in allocated_shares(claim, DRIVER, inventories)
    ]
    return sharing_violations("claims", holdings)


@dataclass(frozen=True)
class Placement:
    """One scheduler's timed run of whole-GPU claim pods."""

    rate: float
    """Pods / (last bind - first create)."""
    latencies_ms: list[float]
    """Each pod's create-to-bind time."""
    violations: int
    """`claim_violations` right after the last bind."""


def placement_round(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    which: str,
    ns: str,
    n: int,
    inventories: Mapping[str, Sequence[pb.Device]],
) -> Placement:
    """A scheduler (`lj` or `kube`, profile `ns`) started and warmed up; `n` pods created in
    `ns` and timed to the last bind; the claims checked; then every pod deleted and every
    claim gone, the scheduler stopped."""
    whole_space(kube, ns)
    stop = start_placer(which, cp, work, ns)
    try:
        warm_up(kube, ns)
        watch = BindWatch(kube, ns)
        sent = create_timed(kube, ns, [whole_pod(f"p{i}", ns, ns) for i in range(n)])
        watch.wait(n, 1800)
    finally:
        stop()
    violations = claim_violations(kube, inventories)
    for line in violations:
        log(line)
    for space in (ns, f"{ns}-warm"):
        clear(kube, space)
    rate = n / (max(watch.times.values()) - min(sent.values()))
    latencies = [(watch.times[name] - t) * 1000 for name, t in sent.items()]
    log(f"{which} ({ns}): {rate:.2f} pods/s, {len(violations)} violations")
    return Placement(rate, latencies, len(violations))


def ms_quantiles(values: Sequence[float]) -> tuple[float, float]:
    """p50 and p99, rounded to 0.1 ms."""
    return round(statistics.median(values), 1), round(pct(values, 0.99), 1)


def lj_rounds(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    n: int,
    rounds: int,
    inventories: Mapping[str, Sequence[pb.Device]],
) -> dict[str, Any]:
    """Alternating rounds of lj-scheduler and kube-scheduler on whole-GPU claim pods: the
    median rates and ratio with its interval, bind latencies, violations, load per round."""
    runs: dict[str, list[Placement]] = {"lj": [], "kube": []}
    loads = []
    for r in range(rounds):
        for which in ("lj", "kube") if r % 2 == 0 else ("kube", "lj"):
            runs[which].append(
                placement_round(kube, cp, work, which, f"{which}-dra-{r}", n, inventories)
            )
        loads.append(round(os.getloadavg()[0], 1))
        log(f"round {r + 1}/{rounds}: ratio {runs['lj'][-1].rate / runs['kube'][-1].rate:.3f}")
    ours = [run.rate for run in runs["lj"]]
    theirs = [run.rate for run in runs["kube"]]
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    low, high, coverage = median_interval(ratios)
    lj_p50, lj_p99 = ms_quantiles([x for run in runs["lj"] for x in run.latencies_ms])
    k_p50, k_p99 = ms_quantiles([x for run in runs["kube"] for x in run.latencies_ms])
    return {
        "scheduler_pods_per_s": round(statistics.median(ours), 2),
        "scheduler_pods_per_s_per_round": [round(x, 2) for x in ours],
        "kube_scheduler_whole_gpu_pods_per_s": round(statistics.median(theirs), 2),
        "kube_scheduler_whole_gpu_pods_per_s_per_round": [round(x, 2) for x in theirs],
        "scheduler_ratio_vs_kube_scheduler": round(statistics.median(ratios), 3),
        "scheduler_ratio_vs_kube_scheduler_per_round": [round(x, 3) for x in ratios],
        "scheduler_ratio_vs_kube_scheduler_interval_low": round(low, 3),
        "scheduler_ratio_vs_kube_scheduler_interval_high": round(high, 3),
        "scheduler_ratio_vs_kube_scheduler_interval_coverage": round(coverage, 3),
        "scheduler_bind_p50_ms": lj_p50,
        "scheduler_bind_p99_ms": lj_p99,
        "kube_scheduler_whole_gpu_bind_p50_ms": k_p50,
        "kube_scheduler_whole_gpu_bind_p99_ms": k_p99,
        "scheduler_rounds": rounds,
        "scheduler_pods": n,
        "scheduler_load_avg_1m_per_round": loads,
        "overcommit_violations": sum(run.violations for runs_ in runs.values() for run in runs_),
    }


def unfit_gang(kube: KubeClient, ns: str, scheduler: str) -> tuple[int, int]:
    """A gang of one member more than the free whole GPUs of UNFIT_NODES, held to those nodes:
    waits until every member was refused (PodScheduled False, for another reason than its claim
    not made yet), watching meanwhile. (most members bound, most claims allocated) seen."""
    size = 8 * len(UNFIT_NODES) + 1
    annotations = {
        P.annotations.gang_group: "unfit",
        P.annotations.gang_min_members: str(size),
        P.annotations.gang_timeout_seconds: str(UNFIT_TIMEOUT_S),
    }
    bodies = [
        whole_pod(f"unfit-{i:02d}", ns, scheduler, annotations, UNFIT_NODES) for i in range(size)
    ]
    create_timed(kube, ns, bodies)
    seen = {"bound": 0, "allocated": 0}
    reasons: set[str] = set()
    claims = f"{RESOURCE_API}/namespaces/{ns}/resourceclaims"

    def refused() -> bool | NotYet:
        pods = kube.list_all(f"/api/v1/namespaces/{ns}/pods")[0]
        allocated = sum(
            1 for c in kube.list_all(claims)[0] if c.get("status", {}).get("allocation")
        )
        seen["bound"] = max(seen["bound"], sum(1 for p in pods if p["spec"].get("nodeName")))
        seen["allocated"] = max(seen["allocated"], allocated)
        refusals = {
            p["metadata"]["name"]: c.get("message", "")
            for p in pods
            for c in p.get("status", {}).get("conditions") or ()
            if c["type"] == "PodScheduled"
            and c["status"] == "False"
            and not any(w in c.get("message", "") for w in WAITING)
        }
        reasons.update(refusals.values())
        waiting = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] not in refusals]
        return not waiting or NotYet(f"{len(waiting)} members not refused yet")

    wait_for(
        refused,
        300,
        f"every member of the gang of {size} on {len(UNFIT_NODES)} nodes refused",
        interval_s=0.5,
    )
    log(f"gang of {size} refused: {sorted(reasons)}")
    return seen["bound"], seen["allocated"]


class ClaimWatch:
    """When each claim of a namespace was first seen made (by the controller manager) and
    first seen allocated (the scheduler's PreBind), from a watch: where a gang's time goes."""

    def __init__(self, kube: KubeClient, ns: str) -> None:
        self.kube = kube
        self.path = f"{RESOURCE_API}/namespaces/{ns}/resourceclaims"
        self.made: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        self.stop = threading.Event()
        _, self.rv = kube.list_all(self.path)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        follow_watch(self.kube, self.path, self.rv, self.stop, self._event)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "BOOKMARK":
            return
        name, now = obj["metadata"]["name"], time.monotonic()
        self.made.setdefault(name, now)
        if (obj.get("status") or {}).get("allocation"):
            self.allocated.setdefault(name, now)


def gang_run(
    kube: KubeClient,
    cp: ControlPlane,
    work: Path,
    size: int,
    inventories: Mapping[str, Sequence[pb.Device]],
) -> dict[str, Any]:
    """lj-scheduler (warm) places a gang of `size` whole-GPU claim pods: creation to the last
    bind; then a gang that cannot fit: none of it bound, none of its claims allocated."""
    ns = "lj-dra-gang"
    whole_space(kube, ns)
    stop = start_placer("lj", cp, work, ns)
    results: dict[str, Any] = {}
    try:
        warm_up(kube, ns)
        watch = BindWatch(kube, ns)
        claims = ClaimWatch(kube, ns)
        annotations = {
            P.annotations.gang_group: "big",
            P.annotations.gang_min_members: str(size),
            P.annotations.gang_timeout_seconds: str(GANG_TIMEOUT_S),
        }
        bodies = [whole_pod(f"big-{i:03d}", ns, ns, annotations) for i in range(size)]
        sent = create_timed(kube, ns, bodies)
        results[f"gang_{size}_create_s"] = round(max(sent.values()) - min(sent.values()), 2)
        try:
            watch.wait(size, GANG_TIMEOUT_S + 60)
            first = min(sent.values())
            results[f"gang_{size}_place_s"] = round(max(watch.times.values()) - first, 2)
            results[f"gang_{size}_claims_made_s"] = round(max(claims.made.values()) - first, 2)
            results[f"gang_{size}_first_allocated_s"] = round(
                min(claims.allocated.values()) - first, 2
            )
            results[f"gang_{size}_first_bound_s"] = round(min(watch.times.values()) - first, 2)
        except TimeoutError as exc:
            log(f"gang of {size}: {exc}")
        watch.stop.set()
        claims.stop.set()
        results[f"gang_{size}_bound"] = len(watch.times)
        partial, bound = partial_gangs(kube, ns)
        violations = len(claim_violations(kube, inventories))
        clear(kube, ns)
        unfit_bound, unfit_allocated = unfit_gang(kube, ns, ns)
        partial += partial_gangs(kube, ns)[0]
        clear(kube, ns)
    finally:
        stop()
    clear(kube, f"{ns}-warm")
    log(
        f"gangs: bound {bound}, unfit gang: {unfit_bound} bound, {unfit_allocated} claims allocated"
    )
    return results | {
        "partial_gangs": partial,
        "gang_unfit_members_bound": unfit_bound,
        "gang_unfit_claims_allocated": unfit_allocated,
        "gang_overcommit_violations": violations,
    }


def lj_scheduler_part(
    kube: KubeClient, cp: ControlPlane, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The rounds against kube-scheduler, then the gangs; overcommit violations of both."""
    inventories = node_inventories(args.nodes)
    results = lj_rounds(kube, cp, work, args.lj_pods, args.lj_rounds, inventories)
    gangs = gang_run(kube, cp, work, args.gang, inventories)
    results["overcommit_violations"] += gangs.pop("gang_overcommit_violations")
    return results | gangs | {"gang_load_avg_1m_at_end": round(os.getloadavg()[0], 1)}


PARTS = ("prepare", "scheduler", "lj-scheduler")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/parts/dra.json"))
    parser.add_argument("--claims", type=int, default=200, help="claims prepared")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=500, help="pods per scheduler run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--lj-pods", type=int, default=100, help="pods per round of lj-scheduler's comparison"
    )
    parser.add_argument(
        "--lj-rounds", type=int, default=5, help="rounds of lj-scheduler and kube-scheduler"
    )
    parser.add_argument("--gang", type=int, default=256, help="members of the gang placed")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="directory: run lj-scheduler under cProfile (thread CPU time), stats per run there",
    )
    parser.add_argument(
        "--only",
        choices=PARTS,
        help="run one part; the part file keeps the other parts' keys",
    )
    args = parser.parse_args()
    parts = [args.only] if args.only else list(PARTS)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        bench_scheduler.PROFILE_DIR = args.profile
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
            if "prepare" in parts:
                results.update(
                    asyncio.run(prepare_run(kube, cp.kubeconfig_path, work, args.claims))
                )
                log(f"prepare: {results}")
            if parts != ["prepare"]:
                log(f"creating {args.nodes} nodes with slices")
                publish_nodes(kube, api, args.nodes)
                results["nodes"] = args.nodes
            if "scheduler" in parts:
                results.update(scheduler_rounds(kube, cp, work, args.pods, args.rounds))
            if "lj-scheduler" in parts:
                results.update(lj_scheduler_part(kube, cp, work, args))
            api.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    prefix = f"{args.only.replace('-', '_')}_" if args.only else ""
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
