"""The admission protocol on the real kubelet (docs/protocol.md): every device pod gets
exactly its own devices under ordinary churn, with port 10255 on and off.

Each test checks the four ledgers at the end: the scheduler's assignment, the Device
Plugin's record, the Runtime's allocations and the kubelet's own record (PodResources).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.proto.pkg.protocol import BIND_PHASE_ALLOCATED, BIND_PHASE_ALLOCATING
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID
from lj_runtimekit.sandbox import Sandbox, workload
from lj_runtimekit.sandbox.workload import pod_manifest
from lj_runtimekit.testkit.waits import NotYet, wait_for

from .conftest import make_bed

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

BED_KINDS = ("tdm-8gpu",)


@pytest.fixture(scope="module", params=["kubelet-pods", "api-watch"])
def bed(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """One node; its Device Plugin reads the kubelet's /pods, or (port 10255 closed) one
    API server watch of the node's pods."""
    yield from make_bed(BED_KINDS, request.session, read_only_port=request.param == "kubelet-pods")


def _pinned(bed: Sandbox, name: str, containers: dict[str, dict[str, int]], **kw: Any) -> Any:
    return pod_manifest(
        name, containers, node_selector={"kubernetes.io/hostname": bed.nodes[0].name}, **kw
    )


def _phases(api: k8s_client.ApiClient, ns: str) -> dict[str, tuple[str, str]]:
    """Pod name -> (phase, "reason: message")."""
    out = {}
    for p in workload.list_pods(api, ns):
        status = p.get("status") or {}
        why = f"{status.get('reason', '')}: {status.get('message', '')}"
        out[p["metadata"]["name"]] = (status.get("phase", ""), why)
    return out


def _wait_phase(
    api: k8s_client.ApiClient, ns: str, want: dict[str, str], timeout_s: float = 90
) -> dict[str, tuple[str, str]]:
    def check() -> bool | NotYet:
        got = _phases(api, ns)
        ok = all(got.get(name, ("", ""))[0] == phase for name, phase in want.items())
        return ok or NotYet(str({n: got.get(n) for n in want}))

    wait_for(check, timeout_s, f"pods {want}")
    return _phases(api, ns)


def _ledgers(bed: Sandbox, api: k8s_client.ApiClient, ns: str) -> list[workload.Placement]:
    """The namespace's rows once the four ledgers agree (and the invariant holds)."""
    found: list[workload.Placement] = []

    def check() -> bool | NotYet:
        rows, runtime = workload.observe(bed, api, [ns])
        problems = workload.invariant_violations(rows, runtime, bed.protocol)
        unrecorded = [r.name for r in rows if r.phase == "Running" and r.allocated is None]
        found[:] = rows
        return (not problems and not unrecorded) or NotYet(f"{problems} unrecorded {unrecorded}")

    wait_for(check, 60, "scheduler, Device Plugin, Runtime and kubelet agree")
    return found


def _whole_holders(rows: list[workload.Placement]) -> dict[str, set[str]]:
    """Whole device -> the running pods the kubelet gave it to."""
    out: dict[str, set[str]] = {}
    for r in rows:
        if r.phase != "Running":
            continue
        for ids in (r.kubelet_ids or {}).values():
            for devices in ids.values():
                for d in devices:
                    if "::" not in d:
                        out.setdefault(d, set()).add(r.name)
    return out


def test_a_rejected_pod_never_lends_its_devices(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """Four pods at once; the Runtime fails the first Allocate: the kubelet rejects that
    pod, which it still lists as Pending for a moment, while it admits the next ones.
    Those get their own devices, never the rejected pod's under its name, and no GPU
    ends up with two running pods."""
    res = bed.protocol.resources
    bed.nodes[0].fail_allocations(0, 1)
    pods = [_pinned(bed, f"p{i}", {"main": {res.gpu: 1}}) for i in range(4)]
    workload.create_pods(api, ns, pods)

    def settled() -> bool | NotYet:
        got = _phases(api, ns)
        failed = [n for n, (phase, _) in got.items() if phase == "Failed"]
        running = [n for n, (phase, _) in got.items() if phase == "Running"]
        return (len(failed) == 1 and len(running) == 3) or NotYet(str(got))

    wait_for(settled, 90, "one pod rejected, three running")
    phases = _phases(api, ns)
    (rejected,) = [n for n, (phase, _) in phases.items() if phase == "Failed"]
    assert "UnexpectedAdmissionError" in phases[rejected][1]
    assert "simulated Runtime failure" in phases[rejected][1]
    rows = _ledgers(bed, api, ns)
    assert all(len(names) == 1 for names in _whole_holders(rows).values())
    assert next(r for r in rows if r.name == rejected).runtime == {}  # nothing in its name
    more = [_pinned(bed, f"next-{i}", {"main": {res.gpu: 1}}) for i in range(2)]
    more.append(_pinned(bed, "slice", {"main": {res.core: 30, res.memory: 30}}))
    workload.create_pods(api, ns, more)
    _wait_phase(api, ns, {p["metadata"]["name"]: "Running" for p in more})
    rows = _ledgers(bed, api, ns)
    assert all(len(names) == 1 for names in _whole_holders(rows).values())


def test_a_partly_allocated_pod_is_rejected_and_its_share_released(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """The first container's Allocate succeeds, the second's fails: the pod is rejected,
    the first container's share is released, and the next pod is served its own."""
    res = bed.protocol.resources
    bed.nodes[0].fail_allocations(1, 1)
    pod = _pinned(bed, "partial", {"a": {res.gpu: 1}, "b": {res.gpu: 1}})
    workload.create_pods(api, ns, [pod])
    _wait_phase(api, ns, {"partial": "Failed"})
    wait_for(
        lambda: (
            not any(r.runtime for r in workload.observe(bed, api, [ns])[0] if r.name == "partial")
        ),
        30,
        "the rejected pod's Runtime allocation released",
    )
    after = _pinned(bed, "after", {"a": {res.gpu: 1}, "b": {res.gpu: 1}})
    workload.create_pods(api, ns, [after])
    _wait_phase(api, ns, {"after": "Running"})
    rows = _ledgers(bed, api, ns)
    assert all(len(names) == 1 for names in _whole_holders(rows).values())


def test_init_containers_devices_go_on_to_the_app_containers(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """The kubelet's device manager hands init containers' devices to the app containers
    (its reuse rule, without asking the plugin's preference): each container gets exactly
    what the kubelet recorded, the Runtime agrees, and the pod holds its devices once."""
    res = bed.protocol.resources
    pods = [
        _pinned(
            bed,
            "init-whole",
            {"a": {res.gpu: 1}, "b": {res.gpu: 1}},
            init_containers={"prep": {res.gpu: 2}},
        ),
        _pinned(
            bed,
            "init-slice",
            {"main": {res.core: 50, res.memory: 20}},
            init_containers={"prep": {res.core: 30, res.memory: 40}},
        ),
    ]
    workload.create_pods(api, ns, pods)
    _wait_phase(api, ns, {"init-whole": "Running", "init-slice": "Running"})
    rows = {r.name: r for r in _ledgers(bed, api, ns)}
    whole = rows["init-whole"].kubelet_ids or {}
    apps = {*whole["a"][res.gpu], *whole["b"][res.gpu]}
    # The kubelet handed the init container's devices on to the app containers (and no
    # longer lists the finished init container); the Runtime served it exactly those.
    init_held = {s.device_id for s in rows["init-whole"].runtime["prep"]}
    assert apps == init_held
    assert len(apps) == 2
    sliced = rows["init-slice"].runtime
    assert {s.device_id for shares in sliced.values() for s in shares} == {
        sliced["main"][0].device_id
    }


def test_core_only_and_memory_only_slices_hold_only_what_they_ask(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """A core-only slice holds 0 % memory (scheduler, plugin and Runtime agree), so a
    memory-only pod fits beside it on the same GPU."""
    res = bed.protocol.resources
    pods = [
        _pinned(bed, "core-only", {"main": {res.core: 100}}),
        _pinned(bed, "memory-only", {"main": {res.memory: 100}}),
    ]
    workload.create_pods(api, ns, pods)
    _wait_phase(api, ns, {"core-only": "Running", "memory-only": "Running"})
    rows = {r.name: r for r in _ledgers(bed, api, ns)}
    (core,) = rows["core-only"].runtime["main"]
    (memory,) = rows["memory-only"].runtime["main"]
    assert (core.core_percent, core.memory_percent) == (100, 0)
    assert (memory.core_percent, memory.memory_percent) == (0, 100)
    assert core.device_id == memory.device_id  # binpack: both on the tightest GPU


def test_deleted_pods_and_an_empty_node_leave_nothing_held(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """Pods deleted around their admission release exactly their own devices; once the
    node's last pod is gone (the kubelet lists `"items": null`) the Runtime holds nothing,
    and the kubelet's record never differed from the plugin's."""
    res = bed.protocol.resources
    core = k8s_client.CoreV1Api(api)
    pods = [_pinned(bed, f"churn-{i}", {"main": {res.gpu: 1}}) for i in range(4)]
    workload.create_pods(api, ns, pods)
    core.delete_namespaced_pod("churn-1", ns, grace_period_seconds=0)
    _wait_phase(api, ns, {"churn-0": "Running", "churn-2": "Running", "churn-3": "Running"})
    _ledgers(bed, api, ns)
    for name in ("churn-0", "churn-2", "churn-3"):
        core.delete_namespaced_pod(name, ns)
    node = bed.nodes[0]
    wait_for(
        lambda: not workload.runtime_allocations([node])[node.name],
        60,
        "the node's Runtime holds nothing once its pods are gone",
    )
    log = node.plugin.log_path.read_text()
    assert "did not answer a PodList" not in log
    assert "kubelet record differs" not in log


def test_a_pod_deleted_before_the_kubelet_admits_it_lends_its_call_to_no_one(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """The kubelet (stopped meanwhile) still admits a pod the API server has already
    deleted, while the node's next device pod is bound: the deleted pod's `Allocate` is
    refused rather than served as the next pod's, which then gets exactly its own call."""
    res = bed.protocol.resources
    core = k8s_client.CoreV1Api(api)
    node = bed.nodes[0]
    kubelet_pid = node.kubelet.process.pid
    assert kubelet_pid is not None
    os.kill(kubelet_pid, signal.SIGSTOP)
    try:
        workload.create_pods(api, ns, [_pinned(bed, "gone", {"main": {res.gpu: 1}})])
        wait_for(lambda: _bound(core, ns, "gone"), 60, "gone to be bound")
        core.delete_namespaced_pod("gone", ns, grace_period_seconds=0)
        workload.create_pods(api, ns, [_pinned(bed, "next", {"main": {res.gpu: 1}})])
        wait_for(lambda: _bound(core, ns, "next"), 60, "next to be bound")
    finally:
        os.kill(kubelet_pid, signal.SIGCONT)
    _wait_phase(api, ns, {"next": "Running"})
    (row,) = _ledgers(bed, api, ns)
    assert row.name == "next"
    log = node.plugin.log_path.read_text()
    assert "kubelet record differs" not in log


def test_a_copy_of_a_running_pods_annotations_is_refused(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """Pods created on the node (spec.nodeName) with every annotation of a running slice
    pod, its bind phase `allocating` or `allocated`: the kubelet fails each with the
    plugin's reason, nothing is allocated in their names, the original keeps its slice."""
    res, ann = bed.protocol.resources, bed.protocol.annotations
    limits = {"main": {res.core: 30, res.memory: 20}}
    workload.create_pods(api, ns, [_pinned(bed, "original", limits)])
    _wait_phase(api, ns, {"original": "Running"})
    live = k8s_client.CoreV1Api(api).read_namespaced_pod("original", ns).metadata
    assert live.annotations[ASSIGNED_POD_UID] == live.uid
    for phase in (BIND_PHASE_ALLOCATING, BIND_PHASE_ALLOCATED):
        name = f"forged-{phase}"
        forged = pod_manifest(name, limits, annotations={**live.annotations, ann.bind_phase: phase})
        forged["spec"]["nodeName"] = bed.nodes[0].name
        del forged["spec"]["schedulerName"]
        workload.create_pods(api, ns, [forged])
        reason = _wait_phase(api, ns, {name: "Failed"})[name][1]
        assert reason.startswith("UnexpectedAdmissionError"), reason
        assert f"written by the scheduler for the pod with UID {live.uid}" in reason, reason
    rows = _ledgers(bed, api, ns)
    assert {r.name: r.runtime == {} for r in rows} == {
        "original": False,
        f"forged-{BIND_PHASE_ALLOCATING}": True,
        f"forged-{BIND_PHASE_ALLOCATED}": True,
    }


def _bound(core: k8s_client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        return bool(core.read_namespaced_pod(name, ns).spec.node_name)
    except k8s_client.ApiException:
        return False
