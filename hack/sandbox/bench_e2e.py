"""End-to-end benchmark on the sandbox bed (real kubelets) -> bench/parts/e2e.json.

Two beds, one after the other, without per-node Exporters (the admission path only):

- churn (4 nodes, tdm-8gpu and mig-8gpu): device pods created in waves (whole GPUs, TDM
  slices incl. core-only and memory-only ones, MIG instances, pods with a run-to-completion
  init container (whole GPUs or a slice), pods with a sidecar (restartable init container)
  declared before or after an init container (whole GPUs or slices), multi-container pods),
  a share deleted (some right after creation, before their admission) and re-created, short
  Runtime error bursts (`fail_allocations`) on random nodes, so that the kubelet rejects
  some pods. Every few seconds and at the end the three sources are checked for a device or
  share held by two pods: the Runtime simulators' allocations, the kubelets' PodResources
  records and the pods' annotations (scheduler assignment, Device Plugin record); and the
  kubelets' device checkpoints for a running container the kubelet injected another
  container's spec into (container key not its own, or visible devices outside its pod's
  assignment). Keys: churn_pods (created), churn_s, churn_device_conflicts (distinct
  conflicts seen at any check), churn_foreign_specs (distinct containers with a foreign
  spec seen at any check), churn_ledger_mismatches (Running pods whose four ledgers
  disagree once the churn settled), churn_rejected_pods (Failed with
  UnexpectedAdmissionError), churn_running_at_end, and the churn's counts.
- burst (8 tdm-8gpu nodes): 200 device pods (whole GPUs and slices that fit) created at
  once (8 create calls in flight, from a child process so that they do not hold the
  watch's GIL); a watch on the namespace stamps (time.monotonic) when each pod is first
  seen bound, with `bind-phase: allocated`, and Running. Keys: burst_200_running_s (first
  create call to all Running), burst_pods_per_s, bind_to_allocated_p50_ms / _p99_ms (they
  include the wait in the kubelet's queue: it admits one pod at a time, and 25 per node
  arrive within seconds). Where fewer nodes start, the keys name the node count.

load_avg_1m_start / load_avg_1m_end: the machine's load around the whole run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from kubernetes import client as k8s_client
from kubernetes.watch.watch import iter_resp_lines

from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.sandbox import Sandbox, SandboxConfig, workload
from lj_runtimekit.sandbox.bed import SandboxError
from lj_runtimekit.sandbox.workload import pod_manifest
from lj_runtimekit.testkit.benchpart import write_part
from lj_runtimekit.testkit.invariant import checkpoint_specs, foreign_specs
from lj_runtimekit.testkit.waits import NotYet, WaitTimeout, wait_for

REJECTED = "UnexpectedAdmissionError"
REQUESTS = {"cpu": "10m", "memory": "32Mi"}
"""cpu and memory per container: a hollow node has one cpu, and the device pods (not cpu)
are what is measured."""


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _say(msg: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _start_bed(cfg: SandboxConfig) -> Sandbox:
    bed = Sandbox(cfg, progress=lambda m: _say(f"  {m}"))
    bed.start()
    with bed.api_client() as api:
        names = [n.name for n in bed.nodes]
        workload.label_nodes(api, names, bed.protocol.labels.enable, "true")
        workload.wait_feature_state(api, names, "enabled", timeout_s=180)
    return bed


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


# -- churn ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A kind of device pod of the churn: containers, init containers (those in `sidecars`
    restartable), and what it holds (GPU equivalents, MIG instances) for keeping the alive
    pods below capacity."""

    kind: str
    containers: dict[str, dict[str, int]]
    init: dict[str, dict[str, int]] = field(default_factory=dict)
    gpus: float = 0.0
    migs: int = 0
    sidecars: frozenset[str] = frozenset()


def _shape(kind: str, protocol: Protocol, rng: random.Random) -> Shape:
    res = protocol.resources
    if kind == "whole1":
        return Shape(kind, {"main": {res.gpu: 1}}, gpus=1)
    if kind == "whole2":
        return Shape(kind, {"main": {res.gpu: 2}}, gpus=2)
    if kind == "slice":
        core, mem = rng.choice((10, 20, 30, 40, 50)), rng.choice((10, 20, 30, 40, 50))
        return Shape(kind, {"main": {res.core: core, res.memory: mem}}, gpus=max(core, mem) / 100)
    if kind == "core-only":
        core = rng.choice((20, 40, 60))
        return Shape(kind, {"main": {res.core: core}}, gpus=core / 100)
    if kind == "memory-only":
        mem = rng.choice((20, 40, 60))
        return Shape(kind, {"main": {res.memory: mem}}, gpus=mem / 100)
    if kind == "mig":
        return Shape(kind, {"main": {res.mig("1g.10gb"): 1}}, migs=1)
    if kind == "init-whole":
        return Shape(kind, {"main": {res.gpu: 1}}, {"prep": {res.gpu: 1}}, gpus=1)
    if kind == "init-slice":
        return Shape(
            kind,
            {"main": {res.core: 50, res.memory: 20}},
            {"prep": {res.core: 30, res.memory: 40}},
            gpus=0.5,
        )
    if kind == "sidecar-before-whole":  # the sidecar runs beside the init container: 2 GPUs
        init = {"side": {res.gpu: 1}, "prep": {res.gpu: 1}}
        return Shape(kind, {"main": {res.gpu: 1}}, init, gpus=2, sidecars=frozenset({"side"}))
    if kind == "sidecar-after-whole":  # the sidecar reuses the init container's GPU: 2 GPUs
        init = {"prep": {res.gpu: 2}, "side": {res.gpu: 1}}
        return Shape(kind, {"main": {res.gpu: 1}}, init, gpus=2, sidecars=frozenset({"side"}))
    if kind == "sidecar-before-slice":  # one GPU: max(20 + 40, 20 + 20) core
        init = {"side": {res.core: 20, res.memory: 20}, "prep": {res.core: 40, res.memory: 30}}
        main = {"main": {res.core: 20, res.memory: 20}}
        return Shape(kind, main, init, gpus=0.6, sidecars=frozenset({"side"}))
    if kind == "sidecar-after-slice":  # one GPU: max(50, 10 + 30) core
        init = {"prep": {res.core: 50, res.memory: 40}, "side": {res.core: 10, res.memory: 10}}
        main = {"main": {res.core: 30, res.memory: 20}}
        return Shape(kind, main, init, gpus=0.5, sidecars=frozenset({"side"}))
    if kind == "multi-whole":
        return Shape(kind, {"a": {res.gpu: 1}, "b": {res.gpu: 1}}, gpus=2)
    if kind == "multi-slice":
        return Shape(
            kind,
            {"a": {res.core: 20, res.memory: 20}, "b": {res.core: 30, res.memory: 10}},
            gpus=0.5,
        )
    raise ValueError(kind)


MIX = {
    "whole1": 20,
    "whole2": 4,
    "slice": 22,
    "core-only": 4,
    "memory-only": 4,
    "mig": 14,
    "init-whole": 8,
    "init-slice": 6,
    "sidecar-before-whole": 4,
    "sidecar-after-whole": 3,
    "sidecar-before-slice": 5,
    "sidecar-after-slice": 4,
    "multi-whole": 8,
    "multi-slice": 10,
}


@dataclass
class PeriodicCheck:
    """`check` every `interval_s` in a thread while a churn runs (a failed check is counted in
    `errors`, and the checks go on); distinct conflict lines kept with the seconds into the
    churn when first seen."""

    bed: Sandbox
    namespace: str
    interval_s: float = 3.0
    conflicts: dict[str, float] = field(default_factory=dict)
    """Distinct conflict line -> seconds into the churn when first seen."""
    checks: int = 0
    errors: list[str] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def check(self, api: k8s_client.ApiClient) -> object:
        """Read every source once; record what is new."""
        raise NotImplementedError

    def _loop(self) -> None:
        with self.bed.api_client() as api:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check(api)
                except Exception as exc:  # a source did not answer: say so, go on
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    _say(f"check failed: {type(exc).__name__}: {exc}")

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)


@dataclass
class Checker(PeriodicCheck):
    """Checks the three sources for a device held by two pods, and the kubelets' device
    checkpoints for a foreign spec, every `interval_s` while the churn runs (and once more at
    the end)."""

    foreign: dict[str, float] = field(default_factory=dict)
    """Distinct foreign-spec line (`invariant.foreign_specs`) -> seconds when first seen."""

    def check(self, api: k8s_client.ApiClient) -> list[workload.Placement]:
        # The Runtime first, then the pods, then the kubelets (as workload.observe reads).
        runtime = workload.runtime_records(self.bed.nodes)
        merged = {uid: p.containers for per in runtime.values() for uid, p in per.items()}
        pods = workload.list_pods(api, self.namespace)
        kubelet = workload.kubelet_records(self.bed.nodes, self.bed.protocol)
        rows = workload.placements(pods, self.bed.protocol, merged, kubelet)
        found = workload.share_conflicts(rows, runtime) + workload.kubelet_conflicts(rows)
        at = round(time.monotonic() - self.began, 1)
        specs = [
            spec
            for node in self.bed.nodes
            for spec in checkpoint_specs(node.hollow.checkpoint_path.read_text())
        ]
        for line in foreign_specs(specs, pods, self.bed.protocol):
            if line not in self.foreign:
                self.foreign[line] = at
                _say(f"FOREIGN SPEC at {at}s: {line}")
        new = [line for line in found if line not in self.conflicts]
        for line in new:
            self.conflicts[line] = at
            _say(f"CONFLICT at {at}s: {line}")
        if new:  # what every source said at that check
            snapshot = self.bed.state_dir / f"conflicts-check-{self.checks + 1}.json"
            rows_data = [dataclasses.asdict(r) for r in rows]
            runtime_data = {
                node: {uid: dataclasses.asdict(p) for uid, p in per.items()}
                for node, per in runtime.items()
            }
            workload.write_json(snapshot, {"new": new, "rows": rows_data, "runtime": runtime_data})
        self.checks += 1
        return rows


def run_churn(nodes: int, total: int, wave: int, seed: int, state: Path) -> dict[str, float]:
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    cfg = SandboxConfig(
        nodes=nodes, kinds=("tdm-8gpu", "mig-8gpu"), state_dir=state, exporter=False
    )
    out: dict[str, float] = {}
    _say(f"churn: starting {nodes} nodes under {state}")
    bed = _start_bed(cfg)
    try:
        with bed.api_client() as api:
            out.update(_churn(bed, api, total, wave, rng))
    except BaseException:
        bed.stop(failed=True)
        raise
    if (
        out["churn_device_conflicts"]
        or out["churn_ledger_mismatches"]
        or out["churn_foreign_specs"]
    ):
        bed.config.keep_state = True
        _say(f"conflicts or mismatches: state and logs kept in {bed.state_dir}")
    bed.stop()
    return out


def _churn(
    bed: Sandbox, api: k8s_client.ApiClient, total: int, wave: int, rng: random.Random
) -> dict[str, float]:
    core = k8s_client.CoreV1Api(api)
    ns = "churn"
    workload.ensure_namespace(api, ns)
    gpus = sum(6 if n.kind.startswith("mig") else 8 for n in bed.nodes)
    migs = sum(7 for n in bed.nodes if n.kind.startswith("mig"))
    gpu_budget, mig_budget = gpus * 0.5, migs * 0.6
    _say(
        f"churn: {gpus} GPUs, {migs} MIG 1g instances; alive at once <= {gpu_budget:g} GPUs"
        f" and {mig_budget:g} MIG instances"
    )
    shapes: dict[str, Shape] = {}  # pod name -> shape, for every alive pod
    recreate: list[Shape] = []
    kinds, weights = list(MIX), list(MIX.values())
    created = deleted_early = deleted_running = injected = unschedulable = 0
    counter = 0
    began = time.monotonic()

    def alive_use() -> tuple[float, int]:
        return sum(s.gpus for s in shapes.values()), sum(s.migs for s in shapes.values())

    def create(shape: Shape, suffix: str = "") -> str:
        nonlocal counter, created
        counter += 1
        name = f"{shape.kind}-{counter}{suffix}"
        pod = pod_manifest(
            name,
            shape.containers,
            init_containers=shape.init or None,
            requests=REQUESTS,
            sidecars=shape.sidecars,
        )
        core.create_namespaced_pod(ns, pod)
        shapes[name] = shape
        created += 1
        return name

    with Checker(bed, ns) as checker:
        waves = 0
        while created < total:
            waves += 1
            pods = {p["metadata"]["name"]: p for p in workload.list_pods(api, ns)}
            for name in [n for n in shapes if _phase(pods.get(n, {})) in ("Failed", "Succeeded")]:
                del shapes[name]  # rejected: holds nothing
            # Delete a share of the running pods (their devices go to the next wave).
            running = [n for n in shapes if _phase(pods.get(n, {})) == "Running"]
            for name in rng.sample(running, k=len(running) * 2 // 5):
                core.delete_namespaced_pod(name, ns)
                recreate.append(shapes.pop(name))
                deleted_running += 1
            # A Runtime error burst on a random node, now and then.
            if rng.random() < 0.4:
                node = rng.choice(bed.nodes)
                skip, count = rng.randint(0, 3), rng.randint(1, 2)
                node.fail_allocations(skip, count)
                injected += count
            batch: list[str] = []
            while len(batch) < wave and created < total:
                gpu_use, mig_use = alive_use()
                again = recreate.pop(0) if recreate else None
                shape = again or _shape(rng.choices(kinds, weights)[0], bed.protocol, rng)
                if gpu_use + shape.gpus > gpu_budget or mig_use + shape.migs > mig_budget:
                    if again is not None:
                        recreate.insert(0, again)
                    break  # no room for now: the next wave deletes some
                batch.append(create(shape, "-r" if again is not None else ""))
                if rng.random() < 0.08:  # deleted right after creation, before admission
                    victim = batch.pop()
                    core.delete_namespaced_pod(victim, ns, grace_period_seconds=0)
                    recreate.append(shapes.pop(victim))
                    deleted_early += 1
            unschedulable += _wait_wave(core, api, ns, batch, shapes)
            gpu_use, mig_use = alive_use()
            _say(
                f"wave {waves}: {created} created, {len(shapes)} alive ({gpu_use:g} GPUs,"
                f" {mig_use} MIG), {deleted_running + deleted_early} deleted,"
                f" {len(checker.conflicts)} conflicts, {len(checker.foreign)} foreign specs in"
                f" {checker.checks} checks"
            )
        churn_s = time.monotonic() - began
    # Settled: every pod Running or Failed, deleted pods' Runtime allocations released,
    # every Running pod recorded by its Device Plugin.
    wait_for(lambda: _all_settled(api, ns), 120, "churn pods Running or Failed")

    def released() -> bool | NotYet:
        rows, runtime = workload.observe(bed, api, [ns])
        uids = {r.uid for r in rows}
        stray = [u for per in runtime.values() for u in per if u not in uids]
        unrecorded = [r.name for r in rows if r.phase == "Running" and r.allocated is None]
        return (not stray and not unrecorded) or NotYet(
            f"released pending {stray}, unrecorded {unrecorded}"
        )

    wait_for(released, 90, "deleted pods released and running pods recorded")
    rows = checker.check(api)
    mismatched = {}
    for r in rows:
        if r.phase == "Running":
            problems = workload.ledger_mismatches(r, bed.protocol)
            if problems:
                mismatched[r.name] = problems
                _say(f"LEDGER MISMATCH {r.name}: {problems}")
    if mismatched:
        workload.write_json(bed.state_dir / "ledger-mismatches.json", {"pods": mismatched})
    if checker.foreign:
        workload.write_json(bed.state_dir / "foreign-specs.json", checker.foreign)
    if checker.conflicts:
        workload.write_json(bed.state_dir / "conflicts.json", checker.conflicts)
        _say(f"{len(checker.conflicts)} conflicts (line: seconds into the churn):")
        for line, at in checker.conflicts.items():
            _say(f"  {at}s {line}")
    by_source = {
        source: sum(line.startswith(f"{source}:") for line in checker.conflicts)
        for source in ("scheduler", "device plugin", "runtime", "kubelet")
    }
    rejected = [r for r in rows if r.phase == "Failed" and REJECTED in r.reason]
    other_failed = [f"{r.name}: {r.reason}" for r in rows if r.phase == "Failed"]
    other_failed = [f for f in other_failed if REJECTED not in f]
    if other_failed:
        _say(f"failed for another reason: {other_failed}")
    if checker.errors:
        _say(f"{len(checker.errors)} checks failed, first: {checker.errors[0]}")
    return {
        "churn_nodes": float(len(bed.nodes)),
        "churn_pods": float(created),
        "churn_waves": float(waves),
        "churn_s": round(churn_s, 1),
        "churn_deleted_before_admission_pods": float(deleted_early),
        "churn_deleted_running_pods": float(deleted_running),
        "churn_injected_allocate_failures": float(injected),
        "churn_rejected_pods": float(len(rejected)),
        "churn_other_failed_pods": float(len(other_failed)),
        "churn_unschedulable_deleted_pods": float(unschedulable),
        "churn_running_at_end": float(sum(r.phase == "Running" for r in rows)),
        "churn_checks": float(checker.checks),
        "churn_failed_checks": float(len(checker.errors)),
        "churn_device_conflicts": float(len(checker.conflicts)),
        "churn_foreign_specs": float(len(checker.foreign)),
        "churn_conflicts_runtime": float(by_source["runtime"]),
        "churn_conflicts_kubelet": float(by_source["kubelet"]),
        "churn_conflicts_scheduler_annotations": float(by_source["scheduler"]),
        "churn_conflicts_device_plugin_annotations": float(by_source["device plugin"]),
        "churn_ledger_mismatches": float(len(mismatched)),
    }


def _all_settled(api: k8s_client.ApiClient, ns: str) -> bool | NotYet:
    pods = workload.list_pods(api, ns)
    waiting = [p["metadata"]["name"] for p in pods if _phase(p) not in ("Running", "Failed")]
    return not waiting or NotYet(f"not yet Running or Failed: {waiting}")


def _wait_wave(
    core: k8s_client.CoreV1Api,
    api: k8s_client.ApiClient,
    ns: str,
    batch: list[str],
    shapes: dict[str, Shape],
    timeout_s: float = 90,
) -> int:
    """Until the wave's pods are Running or Failed. A pod still unbound then (no room after
    all) is deleted and counted; one bound but never admitted is an error."""
    wanted = set(batch)
    last: dict[str, dict[str, Any]] = {}

    def check() -> bool | NotYet:
        last.clear()
        last.update({p["metadata"]["name"]: p for p in workload.list_pods(api, ns)})
        waiting = [n for n in wanted if _phase(last.get(n, {})) not in ("Running", "Failed")]
        return not waiting or NotYet(f"waiting {sorted(waiting)}")

    try:
        wait_for(check, timeout_s, f"a wave of {len(batch)} pods", interval_s=0.5)
        return 0
    except WaitTimeout:
        waiting = [n for n in wanted if _phase(last.get(n, {})) not in ("Running", "Failed")]
        bound = [n for n in waiting if (last.get(n, {}).get("spec") or {}).get("nodeName")]
        if bound:
            raise SandboxError(
                f"pods bound but not admitted in {timeout_s:.0f}s: {sorted(bound)}"
            ) from None
        for name in waiting:
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            shapes.pop(name, None)
        _say(f"deleted {len(waiting)} pods that found no room: {sorted(waiting)}")
        return len(waiting)


# -- burst ------------------------------------------------------------------------------------


WATCH_REQUEST_S = 5
"""How long one watch request lasts (the watch goes on from the last resourceVersion)."""
CREATE_THREADS = 8
"""Create calls in flight at once for the burst."""


class PodWatch:
    """A watch of a namespace's pods (raw JSON events) stamping, with time.monotonic(), when
    each pod is first seen bound, with `bind-phase: allocated`, and Running."""

    def __init__(self, bed: Sandbox, namespace: str, expect: int) -> None:
        self.bed, self.namespace, self.expect = bed, namespace, expect
        self.bound: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.connected = threading.Event()
        self.done = threading.Event()
        self.error: str = ""
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        ann = bed.protocol.annotations
        self._phase_key, self._allocated = ann.bind_phase, "allocated"

    def start(self, timeout_s: float = 30) -> None:
        self._thread.start()
        if not self.connected.wait(timeout_s):
            raise SandboxError(f"the pod watch did not connect in {timeout_s:.0f}s: {self.error}")

    def stop(self) -> None:
        """Ends with the current watch request (the API server closes it within
        WATCH_REQUEST_S; closing the response from here would block until the next event)."""
        self._stop = True
        self._thread.join(WATCH_REQUEST_S + 10)

    def _event(self, pod: dict[str, Any], now: float) -> None:
        name = pod["metadata"]["name"]
        if (pod.get("spec") or {}).get("nodeName"):
            self.bound.setdefault(name, now)
        phase = (pod["metadata"].get("annotations") or {}).get(self._phase_key)
        if phase == self._allocated:
            self.allocated.setdefault(name, now)
        if _phase(pod) == "Running":
            self.running.setdefault(name, now)
            if len(self.running) >= self.expect:
                self.done.set()

    def _run(self) -> None:
        with self.bed.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            version = core.list_namespaced_pod(self.namespace).metadata.resource_version
            while not self._stop:
                try:
                    resp = core.list_namespaced_pod(
                        self.namespace,
                        watch=True,
                        resource_version=version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=WATCH_REQUEST_S,
                        _preload_content=False,
                    )
                    self.connected.set()
                    for line in iter_resp_lines(resp):
                        now = time.monotonic()
                        if not line:
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            self.error = str(obj.get("message"))
                            self.done.set()
                            return
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._event(obj, now)
                    resp.release_conn()
                except Exception as exc:
                    if self._stop:
                        return
                    self.error = f"{type(exc).__name__}: {exc}"
                    time.sleep(0.2)  # the API server closed the stream; watch again


def run_burst(node_counts: list[int], pods: int, state: Path) -> dict[str, float]:
    for nodes in node_counts:
        cfg = SandboxConfig(
            nodes=nodes, kinds=("tdm-8gpu",), state_dir=state, exporter=False, controller=True
        )
        _say(f"burst: starting {nodes} nodes under {state}")
        try:
            bed = _start_bed(cfg)
        except (SandboxError, WaitTimeout) as exc:
            _say(f"burst: {nodes} nodes did not start: {exc}")
            continue
        try:
            out = _burst(bed, pods)
        except BaseException:
            bed.stop(failed=True)
            raise
        bed.stop()
        suffix = "" if nodes == 8 else f"_{nodes}_nodes"
        return {
            f"burst_{pods}_running_s{suffix}": out["running_s"],
            f"burst_pods_per_s{suffix}": out["pods_per_s"],
            f"bind_to_allocated_p50_ms{suffix}": out["p50"],
            f"bind_to_allocated_p99_ms{suffix}": out["p99"],
            f"bind_to_allocated_max_ms{suffix}": out["max"],
            f"burst_bed_start_s{suffix}": round(bed.started_s, 2),
            f"burst_create_calls_s{suffix}": out["create_s"],
            f"burst_invariant_violations{suffix}": out["violations"],
        }
    raise SandboxError(f"no bed of {node_counts} nodes started")


def _burst_pods(protocol: Protocol, pods: int, gpus: int) -> list[dict[str, Any]]:
    """One whole GPU in 8 pods, the rest slices of 10-30 % (20 % on average): they fit."""
    res = protocol.resources
    out = []
    for i in range(pods):
        if i % 8 == 0:
            out.append(pod_manifest(f"w{i}", {"main": {res.gpu: 1}}, requests=REQUESTS))
        else:
            pct = (20, 10, 30, 20)[i % 4]
            limits = {"main": {res.core: pct, res.memory: pct}}
            out.append(pod_manifest(f"s{i}", limits, requests=REQUESTS))
    need = sum(1 if i % 8 == 0 else 0.2 for i in range(pods))
    if need > gpus * 0.95:
        raise SandboxError(f"{pods} burst pods need about {need:g} of {gpus} GPUs")
    return out


def _create_pods(
    kubeconfig: str,
    ns: str,
    manifests: list[dict[str, Any]],
    ready: Any,
    go: Any,
    result: Any,
) -> None:
    """In a child process: create the pods, CREATE_THREADS calls at once, once `go` is set;
    put the seconds it took (or the error) on `result`."""
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = CREATE_THREADS * 2
    with k8s_client.ApiClient(configuration) as api:
        core = k8s_client.CoreV1Api(api)
        ready.set()
        go.wait()
        began = time.monotonic()
        try:
            with ThreadPoolExecutor(CREATE_THREADS) as pool:
                list(pool.map(lambda pod: core.create_namespaced_pod(ns, pod), manifests))
        except Exception as exc:
            result.put(f"{type(exc).__name__}: {exc}")
            return
        result.put(time.monotonic() - began)


def create_at_once(bed: Sandbox, ns: str, manifests: list[dict[str, Any]]) -> tuple[float, float]:
    """Create the pods, CREATE_THREADS calls at once, from a child process (so that the
    calls do not hold this one's GIL while a watch stamps its events); (time.monotonic()
    when the first call went, seconds the calls took)."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, result = ctx.Event(), ctx.Event(), ctx.Queue()
    creator = ctx.Process(
        target=_create_pods, args=(str(bed.kubeconfig), ns, manifests, ready, go, result)
    )
    creator.start()
    try:
        if not ready.wait(60):
            raise SandboxError("the pod creating process did not start in 60s")
        began = time.monotonic()
        go.set()
        outcome = result.get(timeout=120)
    finally:
        creator.join(30)
        if creator.is_alive():
            creator.terminate()
    if isinstance(outcome, str):
        raise SandboxError(f"creating the burst's pods failed: {outcome}")
    return began, float(outcome)


def _burst(bed: Sandbox, pods: int) -> dict[str, float]:
    ns = "burst"
    with bed.api_client() as api:
        workload.ensure_namespace(api, ns)
        manifests = _burst_pods(bed.protocol, pods, 8 * len(bed.nodes))
        watch = PodWatch(bed, ns, pods)
        watch.start()
        try:
            began, create_s = create_at_once(bed, ns, manifests)
            _say(f"burst: {pods} pods created in {create_s:.1f}s")
            if not watch.done.wait(300) or len(watch.running) < pods:
                missing = sorted({p["metadata"]["name"] for p in manifests} - set(watch.running))
                raise SandboxError(
                    f"{len(missing)} burst pods not Running in 300s ({watch.error}): {missing[:20]}"
                )
        finally:
            watch.stop()
        running_s = max(watch.running.values()) - began
        latencies = [
            (watch.allocated[n] - watch.bound[n]) * 1000
            for n in watch.allocated
            if n in watch.bound
        ]
        if len(latencies) < pods:
            _say(f"burst: only {len(latencies)} pods seen both bound and allocated")
        rows, runtime = workload.observe(bed, api, [ns])
        problems = workload.invariant_violations(rows, runtime, bed.protocol)
        if problems:
            _say(f"burst: invariant violations: {problems}")
    return {
        "running_s": round(running_s, 2),
        "pods_per_s": round(pods / running_s, 2),
        "p50": round(statistics.median(latencies), 1),
        "p99": round(_p(latencies, 0.99), 1),
        "max": round(max(latencies), 1),
        "create_s": round(create_s, 2),
        "violations": float(len(problems)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/parts/e2e.json"))
    parser.add_argument("--churn-nodes", type=int, default=4)
    parser.add_argument("--churn-pods", type=int, default=520)
    parser.add_argument("--wave", type=int, default=24)
    parser.add_argument("--burst-nodes", type=int, default=8)
    parser.add_argument("--burst-pods", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip", choices=("churn", "burst"), default=None)
    args = parser.parse_args()
    results: dict[str, float] = {"load_avg_1m_start": round(os.getloadavg()[0], 2)}
    began = time.monotonic()
    steps: list[Callable[[Path], dict[str, float]]] = []
    if args.skip != "churn":
        steps.append(
            lambda s: run_churn(args.churn_nodes, args.churn_pods, args.wave, args.seed, s)
        )
    if args.skip != "burst":
        fallback = [n for n in (args.burst_nodes, 6, 4) if n <= args.burst_nodes]
        steps.append(lambda s: run_burst(sorted(set(fallback), reverse=True), args.burst_pods, s))
    for step in steps:
        results.update(step(Path(tempfile.mkdtemp(prefix="ljbe2e", dir="/tmp"))))
    results["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    results["bench_e2e_s"] = round(time.monotonic() - began, 1)
    write_part(args.out, results, "e2e")
    return 0


if __name__ == "__main__":
    sys.exit(main())
