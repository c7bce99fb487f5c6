"""End-to-end benchmark on DRA sandbox beds (real kubelets, `lj-dra-plugin`) ->
bench/parts/dra.e2e.json (merged into the `dra` section of bench/results.json).

Four beds, one after the other, without per-node Exporters (the admission path only):

- churn (4 DRA nodes, tdm-8gpu and mig-8gpu), once with its pods placed by kube-scheduler,
  then on a fresh bed by lj-scheduler (`--scheduler kube|lj|both`): pods by
  ResourceClaimTemplate, created in waves (whole GPUs, TDM slices incl. core-only and memory-only
  ones, MIG instances, a claim shared by two pods, pods whose init container uses the main
  container's claim or a claim of its own, pods with a sidecar (restartable init
  container) holding its own claim, two-container pods); a share of the running pods
  deleted (some pods right after creation, before their admission) and re-created. Every
  6 waves a node's plugin is killed and restarted, and, 3 waves apart from it, a node's
  kubelet (its fake runtime starts empty: it prepares its pods' claims again and wipes
  the node's slices, which the plugin publishes again). Now and then a node's Runtime
  fails its next Allocate calls (`fail_allocations`): NodePrepareResources answers an
  error for those claims and the kubelet prepares again on a later sync of the pod. A
  wave waits up to 120 s for its pods; those still on their way then are counted late and
  kept. Pods the scheduler finds no room for are deleted and counted (PodScheduled=False,
  but for lj-scheduler's word that it waits for a claim, `WAITING`). The pods alive at
  once hold at most 80 % of `--tdm-gpus-per-node` TDM GPUs per node (the churn's load:
  kube-scheduler 1.34 placed whole and shared claims on one TDM GPU per node, docs/dra.md;
  the bed runs the DRA pin, 1.37, which places them on any) and 60 % of 7 MIG 1g
  instances per MIG node.
  Every few seconds and at the end (not while a kubelet restarts): a device held past what
  it has in the claims' allocations, in the Runtime simulators' claim allocations, in the
  kubelets' PodResources dynamic resources, or a container of a Running pod given (by
  the hollow kubelet's CDI record) a claim's CDI device that is not its pod's. Keys:
  churn_pods (created), churn_device_conflicts (distinct conflicts seen at any check),
  churn_ledger_mismatches (once settled: Running pods whose claims, Runtime allocations,
  PodResources and CDI devices disagree, and Runtime allocations of no live claim),
  churn_stuck_pods (once settled: pods neither Running nor Failed), churn_late_pods,
  churn_plugin_restarts, churn_kubelet_restarts, churn_failed_prepares_injected (Allocate
  failures set on the Runtimes; one set over another before its Allocate calls came
  counts too), churn_failed_prepare_events (the kubelets' FailedPrepareDynamicResources
  events: injected failures, and prepares while a plugin was away) and the churn's
  counts; churn_load_avg_1m_start / _end: the machine's load around the churn (its bed's
  start included).
  With lj-scheduler (`spec.schedulerName: lj-scheduler`; it allocates the claims itself)
  the same pods, waves, kills and checks, with the keys prefixed lj_churn_ instead of
  churn_, and lj-scheduler itself SIGKILLed and started again 2 waves in 6, apart from the
  plugin and kubelet kills: in the waves 1, 7, 13, ... once half of the wave's pods are
  bound (the others still being placed, their claims being allocated or written: it comes
  back once the wave is created), in the waves 5, 11, ... before the wave is created (the
  wave is created while it is away). Keys besides: lj_churn_scheduler_restarts,
  lj_churn_scheduler_kills_mid_binds (kills with some of the wave's pods bound and some
  not), lj_churn_scheduler_restart_max_s (kill to serving again), and
  lj_churn_overcommit_violations (the distinct device conflicts of the claims', the
  Runtimes' and the kubelets' ledgers seen at any check: lj_churn_device_conflicts but
  for the CDI ones).
- device-plugin burst: `bench_e2e.run_burst` (8 tdm-8gpu nodes, 200 pods) -> key
  device_plugin_burst_200_running_s;
- DRA burst (8 tdm-8gpu DRA nodes): 200 pods, each with a claim of a 3 % core and memory
  slice from one template (they fit the first GPU of the nodes), created at once from a
  child process as in bench_e2e; keys burst_200_running_s (first create call to all
  Running, from a watch), burst_pods_per_s, burst_ratio_vs_device_plugin (the DRA time
  over the device-plugin time: below 1 is faster), burst_ledger_mismatches.

load_avg_1m_start / load_avg_1m_end, bench_s: the machine's load around the whole run and
its length (written by the runs that include the bursts).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client as k8s_client

from lj_runtimekit.deviceplugin.internal.dra.cdi import CdiSpecs
from lj_runtimekit.deviceplugin.internal.dra.classes import profile_selector
from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY, memory_step
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.sandbox import Sandbox, SandboxConfig, dra, workload
from lj_runtimekit.sandbox.bed import (
    JOB_AGENT,
    RESOURCE_GROUP,
    RESOURCE_VERSION,
    Component,
    NodeHandle,
    SandboxError,
)
from lj_runtimekit.sandbox.bench_e2e import PeriodicCheck, PodWatch, create_at_once, run_burst
from lj_runtimekit.testkit.benchpart import write_part
from lj_runtimekit.testkit.dra import allocated_shares, claim_pod, claim_template, exactly
from lj_runtimekit.testkit.invariant import Holding, sharing_violations
from lj_runtimekit.testkit.waits import NotYet, WaitTimeout, wait_for

REQUESTS = {"cpu": "10m", "memory": "32Mi"}
"""cpu and memory per container: a hollow node has one cpu."""
KubeletClaims = Mapping[tuple[str, str], Mapping[str, Mapping[str, Sequence[tuple[str, str, str]]]]]
"""(namespace, pod) -> container -> claim -> (driver, pool, device), from PodResources."""


def _say(msg: str) -> None:
    print(f"[bench-dra-e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


WAITING = (
    "to be made from its template",
    "waiting for other members' ResourceClaims",
    "is being allocated for another pod",
    "is being deleted",
)
"""What lj-scheduler says on a pod (PodScheduled=False) while it waits for one of its claims
(made by the controller manager, allocated by another pod's binding, deleted), or a gang
member for the other members' claims, and tries again when the claim changes; kube-scheduler
waits for them without a condition."""


def _refusal(pod: Mapping[str, Any]) -> str:
    """The scheduler's message when it found the pod no room (PodScheduled=False, but for a
    claim it waits for), else ""."""
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            message = str(c.get("message") or c.get("reason") or "unschedulable")
            return "" if any(w in message for w in WAITING) else message
    return ""


def _start_bed(nodes: int, kinds: tuple[str, ...], state: Path) -> Sandbox:
    cfg = SandboxConfig(
        nodes=nodes,
        kinds=kinds,
        state_dir=state,
        exporter=False,
        controller=False,
        dra=True,
    )
    _say(f"starting {nodes} DRA nodes under {state}")
    bed = Sandbox(cfg, progress=lambda m: _say(f"  {m}"))
    bed.start()
    return bed


# -- the checks (pure: what the sources said -> lines) ----------------------------------------


def kubelet_holdings(
    records: KubeletClaims,
    claims: Mapping[str, Mapping[str, Any]],
    driver: str,
    inventories: Mapping[str, Sequence[pb.Device]],
) -> tuple[list[Holding], list[str]]:
    """What the kubelets' PodResources say each claim holds, as (node, claim, share) with the
    capacity the claim's allocation consumes on that device (a claim reported by several
    containers or pods counted once), and a line per reported device that is not in the
    claim's allocation. Claims no longer listed (pods ending) are skipped."""
    holdings: set[Holding] = set()
    problems: list[str] = []
    for (namespace, pod), containers in sorted(records.items()):
        for container, used in sorted(containers.items()):
            for name, devices in sorted(used.items()):
                claim = claims.get(name)
                if claim is None or not (claim.get("status") or {}).get("allocation"):
                    continue
                results = claim["status"]["allocation"]["devices"]["results"]
                resolved = allocated_shares(claim, driver, inventories)
                by_device = {
                    (r["driver"], r["pool"], r["device"]): share
                    for r, (_, _, share) in zip(results, resolved, strict=True)
                }
                for device in devices:
                    if device not in by_device:
                        problems.append(
                            f"kubelet: {namespace}/{pod} container {container} claim {name}"
                            f" device {device} is not in its allocation"
                        )
                        continue
                    holdings.add((device[1], name, by_device[device]))
    return sorted(holdings, key=lambda h: (h[0], h[1], h[2].device_id)), problems


def cdi_lines(
    pods: Sequence[Mapping[str, Any]],
    claims: Mapping[str, Mapping[str, Any]],
    recorded: Mapping[tuple[str, str], Sequence[str] | None],
    device_id: Any,
) -> tuple[list[str], list[str]]:
    """For each container of a Running pod that uses claims, the CDI devices the kubelet
    passed when it created it (`recorded`: (pod uid, container) -> names, None if never)
    against its claims' CDI IDs (`device_id(claim uid)`), in order. Returns (conflicts: a
    CDI device of a claim that is not its pod's, mismatches: any other difference)."""
    owner = {device_id(c["metadata"]["uid"]): name for name, c in claims.items()}
    conflicts, mismatches = [], []
    for pod in pods:
        if _phase(pod) != "Running":
            continue
        meta, spec = pod["metadata"], pod.get("spec") or {}
        by_pod_claim = dra.pod_claims(pod)
        own = set(by_pod_claim.values())
        where = f"{meta['namespace']}/{meta['name']}"
        for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            used = [by_pod_claim.get(r["name"], "") for r in c["resources"].get("claims", ())]
            if not used:
                continue
            got = recorded.get((meta["uid"], c["name"]))
            foreign = [d for d in got or () if d in owner and owner[d] not in own]
            for d in foreign:
                conflicts.append(f"cdi: {where} container {c['name']} got {owner[d]}'s {d}")
            want = [device_id(claims[n]["metadata"]["uid"]) for n in used if n in claims]
            if got is None or list(got) != want:
                mismatches.append(f"{where} container {c['name']}: CDI {got}, claims' {want}")
    return conflicts, mismatches


def split_observed(problems: Sequence[str]) -> tuple[list[str], list[str]]:
    """`dra.observe`'s lines as (sharing conflicts, other disagreements)."""
    conflicts = [p for p in problems if p.startswith(("claims: device", "runtime: device"))]
    return conflicts, [p for p in problems if p not in conflicts]


@dataclass
class Observation:
    conflicts: list[str]
    mismatches: list[str]
    pods: list[dict[str, Any]]


def observe(bed: Sandbox, api: k8s_client.ApiClient, namespace: str) -> Observation:
    """Every source read once: sharing conflicts and other disagreements."""
    driver = bed.protocol.dra.driver
    _, problems = dra.observe(bed, api, namespace)
    conflicts, mismatches = split_observed(problems)
    claims = {c["metadata"]["name"]: c for c in dra.list_claims(api, namespace)}
    records = workload.kubelet_claim_records(bed.nodes)
    mine = {k: v for k, v in records.items() if k[0] == namespace}
    holdings, extra = kubelet_holdings(
        mine, claims, driver, workload.runtime_inventories(bed.nodes)
    )
    conflicts += sharing_violations("kubelet", holdings) + extra
    pods = workload.list_pods(api, namespace)
    nodes = {n.name: n for n in bed.nodes}
    recorded: dict[tuple[str, str], list[str] | None] = {}
    for pod in pods:
        node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        if node is None or _phase(pod) != "Running":
            continue
        for c in [*(pod["spec"].get("initContainers") or ()), *pod["spec"]["containers"]]:
            uid = pod["metadata"]["uid"]
            recorded[(uid, c["name"])] = node.hollow.container_cdi_devices(uid, c["name"])
    specs = CdiSpecs(bed.nodes[0].cdi_dir, driver)  # a claim's CDI ID names no node
    cdi_conflicts, cdi_mismatches = cdi_lines(pods, claims, recorded, specs.device_id)
    return Observation(conflicts + cdi_conflicts, mismatches + cdi_mismatches, pods)


@dataclass
class Checker(PeriodicCheck):
    """`observe` every `interval_s` while the churn runs, not while `quiet` is held (a
    kubelet being restarted answers no PodResources)."""

    quiet: threading.Lock = field(default_factory=threading.Lock)

    def check(self, api: k8s_client.ApiClient) -> Observation:
        with self.quiet:
            seen = observe(self.bed, api, self.namespace)
        at = round(time.monotonic() - self.began, 1)
        for line in seen.conflicts:
            if line not in self.conflicts:
                self.conflicts[line] = at
                _say(f"CONFLICT at {at}s: {line}")
        self.checks += 1
        return seen


# -- churn ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A kind of pod of the churn: pod claim -> template name, which containers (and init
    containers, those in `sidecars` restartable) use which pod claims, and what it holds
    (GPU equivalents, MIG instances) for keeping the alive pods below capacity. `shared`:
    two pods using one ResourceClaim of the first template."""

    kind: str
    claims: Mapping[str, str]
    containers: Mapping[str, tuple[str, ...]]
    init: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sidecars: frozenset[str] = frozenset()
    gpus: float = 0.0
    migs: int = 0
    shared: bool = False


MIX = {
    "whole": 10,
    "slice": 24,
    "core-only": 6,
    "memory-only": 6,
    "mig": 18,
    "shared": 6,
    "init-same": 6,
    "init-own": 6,
    "sidecar": 8,
    "multi": 8,
}


class Templates:
    """The churn's ResourceClaimTemplates by request, created on first use."""

    def __init__(self, api: k8s_client.ApiClient, protocol: Protocol, ns: str, mem_step: int):
        self.api, self.protocol, self.ns, self.mem_step = api, protocol, ns, mem_step
        self.made: dict[str, dict[str, Any]] = {}

    def request(self, name: str) -> dict[str, Any]:
        dra_names = self.protocol.dra
        if name == "whole":
            return exactly("r", dra_names.whole_class("gpu"))
        if name == "mig":
            return exactly(
                "r", dra_names.mig_class, selector=profile_selector(self.protocol, "1g.10gb")
            )
        _, core, memory = name.split("-")
        capacity = {CORES: core, MEMORY: str(int(memory) * self.mem_step)}
        return exactly("r", dra_names.share_class("gpu"), capacity=capacity)

    def get(self, name: str) -> str:
        if name not in self.made:
            obj = claim_template(name, [self.request(name)], self.ns)
            dra.create_templates(self.api, [obj])
            self.made[name] = obj
        return name


def _slice(core: int, memory: int) -> str:
    return f"s-{core}-{memory}"


def _shape(kind: str, rng: random.Random) -> Shape:
    main = {"main": ("c",)}
    if kind == "whole":
        return Shape(kind, {"c": "whole"}, main, gpus=1)
    if kind == "mig":
        return Shape(kind, {"c": "mig"}, main, migs=1)
    if kind == "slice":
        core, mem = rng.choice((5, 10, 15, 20)), rng.choice((5, 10, 15, 20))
        return Shape(kind, {"c": _slice(core, mem)}, main, gpus=max(core, mem) / 100)
    if kind == "core-only":
        core = rng.choice((10, 20))
        return Shape(kind, {"c": _slice(core, 0)}, main, gpus=core / 100)
    if kind == "memory-only":
        mem = rng.choice((10, 20))
        return Shape(kind, {"c": _slice(0, mem)}, main, gpus=mem / 100)
    if kind == "shared":  # two pods, one claim
        return Shape(kind, {"c": _slice(10, 10)}, main, gpus=0.1, shared=True)
    if kind == "init-same":  # the init container uses the main container's claim
        return Shape(kind, {"c": "mig"}, main, {"prep": ("c",)}, migs=1)
    if kind == "init-own":
        claims = {"c": _slice(10, 10), "p": _slice(5, 10)}
        return Shape(kind, claims, main, {"prep": ("p",)}, gpus=0.2)
    if kind == "sidecar":  # a restartable init container with its own claim
        claims = {"c": _slice(10, 5), "s": "mig"}
        return Shape(kind, claims, main, {"side": ("s",)}, frozenset({"side"}), 0.1, 1)
    if kind == "multi":
        claims = {"a": _slice(10, 10), "b": "mig"}
        return Shape(kind, claims, {"a": ("a",), "b": ("b",)}, gpus=0.1, migs=1)
    raise ValueError(kind)


def _manifest(
    name: str,
    shape: Shape,
    templates: Templates,
    ns: str,
    claim: str = "",
    scheduler_name: str | None = None,
) -> dict[str, Any]:
    pod = claim_pod(
        name,
        {c: templates.get(t) for c, t in shape.claims.items()},
        containers=tuple({c: u} for c, u in shape.containers.items()),
        init_containers=tuple({c: u} for c, u in shape.init.items()),
        limits=REQUESTS,
        namespace=ns,
        scheduler_name=scheduler_name,
    )
    if claim:  # the pod claim names a ResourceClaim instead of a template
        pod["spec"]["resourceClaims"] = [
            {"name": c, "resourceClaimName": claim} for c in shape.claims
        ]
    for container in pod["spec"].get("initContainers") or ():
        if container["name"] in shape.sidecars:
            container["restartPolicy"] = "Always"
        else:  # the hollow node runs it as a local process, which ends
            container["command"] = [JOB_AGENT, "--version"]
    return pod


@dataclass
class Churn:
    """The churn's state: alive pods by name -> shape, shared claims by pod; `scheduler_name`
    goes on every pod (None: kube-scheduler's default)."""

    bed: Sandbox
    api: k8s_client.ApiClient
    ns: str
    templates: Templates
    rng: random.Random
    scheduler_name: str | None = None
    shapes: dict[str, Shape] = field(default_factory=dict)
    claim_of: dict[str, str] = field(default_factory=dict)
    """Pod -> the ResourceClaim it shares (shared pods only)."""
    counts: dict[str, int] = field(default_factory=dict)
    counter: int = 0

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def use(self) -> tuple[float, int]:
        seen: set[str] = set()
        gpus, migs = 0.0, 0
        for name, s in self.shapes.items():
            claim = self.claim_of.get(name)
            if claim in seen:
                continue
            if claim:
                seen.add(claim)
            gpus, migs = gpus + s.gpus, migs + s.migs
        return gpus, migs

    def create(self, shape: Shape, suffix: str) -> list[str]:
        core = k8s_client.CoreV1Api(self.api)
        self.counter += 1
        base = f"{shape.kind}-{self.counter}{suffix}"
        if not shape.shared:
            manifest = _manifest(base, shape, self.templates, self.ns, "", self.scheduler_name)
            core.create_namespaced_pod(self.ns, manifest)
            self.shapes[base] = shape
            self.count("pods")
            return [base]
        (template,) = shape.claims.values()
        obj = {
            "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
            "kind": "ResourceClaim",
            "metadata": {"name": base, "namespace": self.ns},
            "spec": {"devices": {"requests": [self.templates.request(template)]}},
        }
        k8s_client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, self.ns, "resourceclaims", obj
        )
        names = [f"{base}-a", f"{base}-b"]
        for name in names:
            manifest = _manifest(name, shape, self.templates, self.ns, base, self.scheduler_name)
            core.create_namespaced_pod(self.ns, manifest)
            self.shapes[name] = shape
            self.claim_of[name] = base
            self.count("pods")
        return names

    def delete(self, name: str, *, now: bool = False) -> Shape | None:
        """Delete the pod (with its partner and their claim if shared); its shape, once."""
        core = k8s_client.CoreV1Api(self.api)
        claim = self.claim_of.pop(name, "")
        names = [name]
        if claim:
            names += [n for n, c in list(self.claim_of.items()) if c == claim]
            for n in names[1:]:
                del self.claim_of[n]
        shape = None
        for n in names:
            shape = self.shapes.pop(n, None) or shape
            core.delete_namespaced_pod(n, self.ns, grace_period_seconds=0 if now else None)
        if claim:
            k8s_client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, self.ns, "resourceclaims", claim
            )
        return shape


SCHEDULERS = {"kube": "churn_", "lj": "lj_churn_"}
"""The churn's schedulers (`--scheduler`) -> the prefix of their keys."""


def run_churn(
    scheduler: str,
    nodes: int,
    total: int,
    wave: int,
    seed: int,
    tdm_gpus: float,
    state: Path,
    keep_state: bool = False,
) -> dict[str, float]:
    """The churn with its pods placed by `scheduler` (SCHEDULERS) on a bed of its own; its
    keys prefixed. The bed's state and logs are kept when something went wrong (or with
    `keep_state`)."""
    load_start = round(os.getloadavg()[0], 2)
    bed = _start_bed(nodes, ("tdm-8gpu", "mig-8gpu"), state)
    try:
        with bed.api_client() as api:
            out = _churn(bed, api, total, wave, random.Random(seed), tdm_gpus, scheduler)  # noqa: S311
    except BaseException:
        bed.stop(failed=True)
        raise
    wrong = ("device_conflicts", "ledger_mismatches", "stuck_pods", "late_pods")
    if keep_state or any(out[k] for k in (*wrong, "unschedulable_deleted_pods")):
        bed.config.keep_state = True
        _say(f"state and logs kept in {bed.state_dir}")
    bed.stop()
    out |= {"load_avg_1m_start": load_start, "load_avg_1m_end": round(os.getloadavg()[0], 2)}
    return {f"{SCHEDULERS[scheduler]}{k}": v for k, v in out.items()}


class SchedulerKill:
    """SIGKILLs lj-scheduler during a wave and starts it again once the wave is created
    (from this thread: a process dies with the thread that started it). `after_bound` 0: at
    once, the wave created while it is away; else once `after_bound` of the wave's pods
    are bound (half of it, if the wave came out smaller), the rest still being placed, their
    claims allocated or being written."""

    def __init__(
        self, scheduler: Component, watch: PodWatch, batch: list[str], after_bound: int
    ) -> None:
        self.scheduler, self.watch, self.batch = scheduler, watch, batch
        self.after_bound = after_bound
        self.at: tuple[int, int] | None = None
        """(the wave's pods bound, created) when killed; None: not killed."""
        self.killed_at = 0.0
        self.restart_s = 0.0
        """Kill to serving again."""
        self.poll()

    def _bound(self) -> int:
        return sum(n in self.watch.bound for n in self.batch)

    def poll(self, wanted: int | None = None) -> bool:
        """Kill it if due (`wanted` pods bound; default `after_bound`); whether killed."""
        if self.at is None and self._bound() >= (self.after_bound if wanted is None else wanted):
            self.at = (self._bound(), len(self.batch))
            self.killed_at = time.monotonic()
            self.scheduler.kill()
        return self.at is not None

    def created(self, timeout_s: float = 60) -> None:
        """The wave is created: kill it once half of the wave is bound (not at all if every
        pod is bound first, or none within `timeout_s`), then start it again."""
        half = min(self.after_bound, max(1, len(self.batch) // 2))
        deadline = time.monotonic() + timeout_s
        while not self.poll(half) and time.monotonic() < deadline:
            if self.batch and self._bound() == len(self.batch):
                return
            time.sleep(0.01)
        if self.at is not None:
            self.scheduler.start()
            self.scheduler.wait_ready(60)
            self.restart_s = time.monotonic() - self.killed_at


def _churn(
    bed: Sandbox,
    api: k8s_client.ApiClient,
    total: int,
    wave: int,
    rng: random.Random,
    tdm_gpus: float,
    scheduler: str,
) -> dict[str, float]:
    ns = "dra-churn"
    workload.ensure_namespace(api, ns)
    inventories = workload.runtime_inventories(bed.nodes)
    first = next(d for devs in inventories.values() for d in devs if d.mode == pb.DEVICE_MODE_TDM)
    templates = Templates(api, bed.protocol, ns, memory_step(first))
    lj = scheduler == "lj"
    churn = Churn(bed, api, ns, templates, rng, workload.SCHEDULER_NAME if lj else None)
    gpu_budget = len(bed.nodes) * tdm_gpus * 0.8
    mig_budget = sum(7 for n in bed.nodes if n.kind.startswith("mig")) * 0.6
    _say(
        f"churn ({scheduler}-scheduler): alive at once <= {gpu_budget:g} GPUs and"
        f" {mig_budget:g} MIG 1g instances"
    )
    kinds, weights = list(MIX), list(MIX.values())
    recreate: list[Shape] = []
    restarts = kubelet_restarts = injected = waves = 0
    kills: list[SchedulerKill] = []
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        checker = stack.enter_context(Checker(bed, ns))
        watch = PodWatch(bed, ns, expect=sys.maxsize)  # when each pod is first seen bound
        if lj:
            watch.start()
            stack.callback(watch.stop)
        while churn.counts.get("pods", 0) < total:
            waves += 1
            pods = {p["metadata"]["name"]: p for p in workload.list_pods(api, ns)}
            for name in [
                n for n in churn.shapes if _phase(pods.get(n, {})) in ("Failed", "Succeeded")
            ]:
                if name in churn.shapes:
                    churn.count("failed")
                    churn.delete(name)
            running = [n for n in churn.shapes if _phase(pods.get(n, {})) == "Running"]
            for name in rng.sample(running, k=len(running) // 2):
                if name in churn.shapes:
                    shape = churn.delete(name)
                    churn.count("deleted_running")
                    if shape is not None:
                        recreate.append(shape)
            if waves % 6 == 3:  # a plugin killed and started again mid-churn
                node = rng.choice(bed.nodes)
                _say(f"churn: restarting the plugin of {node.name}")
                node.plugin.restart(crash=True)
                restarts += 1
            if waves % 6 == 0:  # a kubelet killed and started again mid-churn
                node = rng.choice(bed.nodes)
                _say(f"churn: restarting the kubelet of {node.name}")
                _restart_kubelet(node, checker)
                kubelet_restarts += 1
            if rng.random() < 0.4:  # a Runtime failing its next Allocate calls: failed prepares
                node = rng.choice(bed.nodes)
                skip, count = rng.randint(0, 3), rng.randint(1, 2)
                node.fail_allocations(skip, count)
                injected += count
            batch: list[str] = []
            kill = None
            if lj and waves % 6 in (1, 5):  # lj-scheduler killed: amid the binds, or at once
                after = max(1, wave // 2) if waves % 6 == 1 else 0
                kill = SchedulerKill(bed.components["scheduler"], watch, batch, after)
                kills.append(kill)
            while len(batch) < wave and churn.counts.get("pods", 0) < total:
                gpu_use, mig_use = churn.use()
                again = recreate.pop(0) if recreate else None
                shape = again or _shape(rng.choices(kinds, weights)[0], rng)
                if gpu_use + shape.gpus > gpu_budget or mig_use + shape.migs > mig_budget:
                    if again is not None:
                        recreate.insert(0, again)
                    break  # no room for now: the next wave deletes some
                names = churn.create(shape, "-r" if again is not None else "")
                if rng.random() < 0.08:  # deleted right after creation, before admission
                    churn.delete(names[0], now=True)
                    churn.count("deleted_early", len(names))
                    continue
                batch += names
                if kill is not None:
                    kill.poll()
            if kill is not None:
                kill.created()
                if kill.at is not None:
                    when = f"with {kill.at[0]} of the {kill.at[1]} pods created by then bound"
                    _say(
                        f"churn: lj-scheduler killed in wave {waves}"
                        f" {when if kill.after_bound else 'before its pods were created'};"
                        f" serving again {kill.restart_s:.1f}s after the kill"
                    )
            _wait_wave(churn, batch)
        churn_s = time.monotonic() - began
        _say(
            f"churn: {churn.counts.get('pods', 0)} pods in {waves} waves, {churn_s:.0f}s; settling"
        )
        mismatches, stuck = _settle(bed, api, ns, checker)
    running_at_end = sum(_phase(p) == "Running" for p in workload.list_pods(api, ns))
    failed_prepares = _failed_prepare_events(api, ns)
    if checker.errors:
        _say(f"{len(checker.errors)} checks failed, first: {checker.errors[0]}")
    if checker.conflicts:
        workload.write_json(bed.state_dir / "conflicts.json", checker.conflicts)
    by_source = {
        s: sum(line.startswith(f"{s}:") for line in checker.conflicts)
        for s in ("claims", "runtime", "kubelet", "cdi")
    }
    c = churn.counts
    out = {
        "nodes": float(len(bed.nodes)),
        "pods": float(c.get("pods", 0)),
        "waves": float(waves),
        "s": round(churn_s, 1),
        "plugin_restarts": float(restarts),
        "kubelet_restarts": float(kubelet_restarts),
        "failed_prepares_injected": float(injected),
        "failed_prepare_events": float(failed_prepares),
        "deleted_running_pods": float(c.get("deleted_running", 0)),
        "deleted_before_admission_pods": float(c.get("deleted_early", 0)),
        "unschedulable_deleted_pods": float(c.get("unschedulable", 0)),
        "failed_pods": float(c.get("failed", 0)),
        "running_at_end": float(running_at_end),
        "late_pods": float(c.get("late", 0)),
        "stuck_pods": float(len(stuck)),
        "checks": float(checker.checks),
        "failed_checks": float(len(checker.errors)),
        "device_conflicts": float(len(checker.conflicts)),
        **{f"conflicts_{s}": float(n) for s, n in by_source.items()},
        "ledger_mismatches": float(len(mismatches)),
    }
    if lj:
        kills = [k for k in kills if k.at is not None]
        mid = [k for k in kills if k.at is not None and 0 < k.at[0] < len(k.batch)]
        out |= {
            "scheduler_restarts": float(len(kills)),
            "scheduler_kills_mid_binds": float(len(mid)),
            "scheduler_restart_max_s": round(max((k.restart_s for k in kills), default=0), 1),
            "overcommit_violations": float(
                sum(by_source[s] for s in ("claims", "runtime", "kubelet"))
            ),
        }
    return out


def _restart_kubelet(node: NodeHandle, checker: Checker, timeout_s: float = 60) -> None:
    """Kill the node's kubelet and start it again (it registers the running plugin again,
    which publishes the slices it wipes); no check runs until its PodResources answer."""
    with checker.quiet:
        node.kubelet.restart(timeout_s, crash=True)
        wait_for(
            lambda: workload.kubelet_claim_records([node]) is not None,
            timeout_s,
            f"the PodResources API of {node.name}'s kubelet (log {node.kubelet.log_path})",
            ignore=(grpc.RpcError,),
        )


def _failed_prepare_events(api: k8s_client.ApiClient, ns: str) -> int:
    """How many times the kubelets reported a failed NodePrepareResources in `ns`."""
    events = k8s_client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector="reason=FailedPrepareDynamicResources"
    )
    return sum(e.count or 1 for e in events.items)


def _wait_wave(churn: Churn, batch: list[str], timeout_s: float = 120) -> None:
    """Until the wave's pods are Running, Failed or found no room (those are deleted and
    counted). Pods still on their way then (a prepare failed and waits for the kubelet's
    retry, or their kubelet restarted) are counted late and stay in the churn: later waves
    delete them once Running, and the settle waits for them."""
    wanted = set(batch)
    last: dict[str, dict[str, Any]] = {}

    def done(pod: Mapping[str, Any]) -> bool:
        return _phase(pod) in ("Running", "Failed", "Succeeded") or bool(_refusal(pod))

    def check() -> bool | NotYet:
        last.clear()
        last.update({p["metadata"]["name"]: p for p in workload.list_pods(churn.api, churn.ns)})
        waiting = [n for n in wanted if n in churn.shapes and not done(last.get(n, {}))]
        return not waiting or NotYet(f"waiting {sorted(waiting)}")

    try:
        wait_for(check, timeout_s, f"a wave of {len(batch)} pods", interval_s=0.5)
    except WaitTimeout:
        late = sorted(n for n in wanted if n in churn.shapes and not done(last.get(n, {})))
        churn.count("late", len(late))
        _say(f"churn: {len(late)} pods not Running in {timeout_s:.0f}s, kept: {late}")
    for name in sorted(wanted):
        refusal = _refusal(last.get(name, {}))
        if name in churn.shapes and refusal:
            _say(f"churn: {name} found no room, deleted: {refusal}")
            churn.count("unschedulable", 1 + bool(churn.claim_of.get(name)))
            churn.delete(name, now=True)


def _busy(seen: Observation) -> list[str]:
    return [p["metadata"]["name"] for p in seen.pods if _phase(p) not in ("Running", "Failed")]


def _settle(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str, checker: Checker, timeout_s: float = 120
) -> tuple[list[str], list[str]]:
    """Until every pod is Running or Failed and every source agrees (pods still ending make
    transient differences); the disagreements and the pods neither Running nor Failed left
    then."""
    last: list[Observation] = []

    def agreed() -> bool | NotYet:
        seen = checker.check(api)
        last[:] = [seen]
        if _busy(seen) or seen.mismatches:
            return NotYet(f"not settled: {_busy(seen)[:10]}, {seen.mismatches[:5]}")
        return True

    try:
        wait_for(agreed, timeout_s, "the churn's ledgers to agree", interval_s=2)
    except WaitTimeout as exc:
        _say(f"churn: {exc}")
    mismatches = last[0].mismatches if last else ["never observed"]
    stuck = _busy(last[0]) if last else []
    for line in mismatches:
        _say(f"MISMATCH: {line}")
    if stuck:
        _say(f"STUCK (neither Running nor Failed): {stuck}")
    if mismatches or stuck:
        workload.write_json(
            bed.state_dir / "mismatches.json", {"mismatches": mismatches, "stuck": stuck}
        )
    return mismatches, stuck


# -- burst ------------------------------------------------------------------------------------


BURST_SLICE = 3
"""Core and memory percent of each burst pod's slice (33 fit one GPU)."""


def run_dra_burst(nodes: int, pods: int, state: Path) -> dict[str, float]:
    bed = _start_bed(nodes, ("tdm-8gpu",), state)
    try:
        out = _dra_burst(bed, pods)
    except BaseException:
        bed.stop(failed=True)
        raise
    bed.stop()
    return out


def _dra_burst(bed: Sandbox, pods: int) -> dict[str, float]:
    ns = "burst"
    if pods > len(bed.nodes) * (100 // BURST_SLICE):
        raise SandboxError(f"{pods} slices of {BURST_SLICE}% do not fit {len(bed.nodes)} GPUs")
    with bed.api_client() as api:
        workload.ensure_namespace(api, ns)
        inventories = workload.runtime_inventories(bed.nodes)
        step = memory_step(next(iter(inventories.values()))[0])
        capacity = {CORES: str(BURST_SLICE), MEMORY: str(BURST_SLICE * step)}
        request = exactly("s", bed.protocol.dra.share_class("gpu"), capacity=capacity)
        dra.create_templates(api, [claim_template("slice", [request], ns)])
        manifests = [
            claim_pod(
                f"s{i}",
                {"c": "slice"},
                containers=({"main": ("c",)},),
                limits=REQUESTS,
                namespace=ns,
            )
            for i in range(pods)
        ]
        watch = PodWatch(bed, ns, pods)
        watch.start()
        try:
            began, create_s = create_at_once(bed, ns, manifests)
            _say(f"DRA burst: {pods} pods created in {create_s:.1f}s")
            if not watch.done.wait(300) or len(watch.running) < pods:
                missing = sorted({p["metadata"]["name"] for p in manifests} - set(watch.running))
                raise SandboxError(
                    f"{len(missing)} DRA burst pods not Running in 300s ({watch.error}):"
                    f" {missing[:20]}"
                )
        finally:
            watch.stop()
        running_s = max(watch.running.values()) - began
        seen = observe(bed, api, ns)
        for line in seen.conflicts + seen.mismatches:
            _say(f"DRA burst: {line}")
    return {
        f"burst_{pods}_running_s": round(running_s, 2),
        "burst_pods_per_s": round(pods / running_s, 2),
        "burst_create_calls_s": round(create_s, 2),
        "burst_nodes": float(len(bed.nodes)),
        "burst_bed_start_s": round(bed.started_s, 2),
        "burst_device_conflicts": float(len(seen.conflicts)),
        "burst_ledger_mismatches": float(len(seen.mismatches)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/parts/dra.e2e.json"))
    parser.add_argument("--churn-nodes", type=int, default=4)
    parser.add_argument("--churn-pods", type=int, default=520)
    parser.add_argument("--wave", type=int, default=16)
    parser.add_argument(
        "--tdm-gpus-per-node",
        type=float,
        default=1.0,
        help="TDM GPUs' worth of whole and shared claims alive at once per node (the churn's"
        " load; kube-scheduler 1.34 placed them on one TDM GPU per node, 1.37 on any)",
    )
    parser.add_argument("--burst-nodes", type=int, default=8)
    parser.add_argument("--burst-pods", type=int, default=200)
    parser.add_argument(
        "--scheduler",
        choices=("kube", "lj", "both"),
        default="both",
        help="who places the churn's pods: kube-scheduler (keys churn_*), lj-scheduler (keys"
        " lj_churn_*, with its kills) or both, kube-scheduler first, each on a bed of its own",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--keep-state", action="store_true", help="keep the churn beds' state and logs"
    )
    parser.add_argument("--skip", choices=("churn", "burst"), default=None)
    args = parser.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    results: dict[str, float] = {}
    began = time.monotonic()

    def state() -> Path:
        return Path(tempfile.mkdtemp(prefix="ljbdra", dir="/tmp"))

    if args.skip != "churn":
        for scheduler in SCHEDULERS if args.scheduler == "both" else (args.scheduler,):
            results.update(
                run_churn(
                    scheduler,
                    args.churn_nodes,
                    args.churn_pods,
                    args.wave,
                    args.seed,
                    args.tdm_gpus_per_node,
                    state(),
                    args.keep_state,
                )
            )
    if args.skip != "burst":
        key = f"burst_{args.burst_pods}_running_s"
        plugin = run_burst([args.burst_nodes], args.burst_pods, state())
        (plugin_s,) = [v for k, v in plugin.items() if k.startswith(key)]
        results[f"device_plugin_{key}"] = plugin_s
        results.update(run_dra_burst(args.burst_nodes, args.burst_pods, state()))
        results["burst_ratio_vs_device_plugin"] = round(results[key] / plugin_s, 2)
    if args.skip != "burst":  # the whole run's (a churn has its own)
        results["load_avg_1m_start"] = load_start
        results["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
        results["bench_s"] = round(time.monotonic() - began, 1)
    write_part(args.out, results, "dra")
    return 0


if __name__ == "__main__":
    sys.exit(main())
