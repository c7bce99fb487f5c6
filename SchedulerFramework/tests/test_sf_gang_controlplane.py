"""Gang scheduling by lj-scheduler processes on the real control plane with KWOK nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling.gang import (
    EXCLUSIVE_TOPOLOGY,
    JOB_KEY,
    JOBSET_NAME,
)
from lj_runtimekit.testkit.scheduler.process import (
    SchedulerProcess,
    pod_manifest,
)
from lj_runtimekit.testkit.scheduler.process import bound_pods as bound
from lj_runtimekit.testkit.scheduler.process import pod_events as events
from lj_runtimekit.testkit.waits import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("runtime_class")]
P = load_protocol()
A = P.annotations
GPU = P.resources.gpu


def make_nodes(
    factory: NodeFactory, prefix: str, blocks: int, switches: int, per: int, runtime: str
) -> list[str]:
    specs = [
        GpuNodeSpec(
            name=f"{prefix}-b{b}s{s}n{n}",
            topology_block=f"b{b}",
            topology_switch=f"s{s}",
            labels={P.labels.runtime_version: runtime},
        )
        for b in range(blocks)
        for s in range(switches)
        for n in range(per)
    ]
    names = factory.create_many(specs)
    factory.wait_ready(names)
    return names


def member(
    ns: str,
    name: str,
    selector: dict[str, str],
    annotations: dict[str, str],
    labels: dict[str, str] | None = None,
    gpus: str = "8",
) -> dict[str, Any]:
    body = pod_manifest(
        name,
        f"lj-{ns}",
        dict(selector),
        {GPU: gpus},
        annotations=annotations,
        terminationGracePeriodSeconds=0,
    )
    body["metadata"]["labels"] = labels or {}
    return body


def create_gang(
    core: k8s_client.CoreV1Api,
    ns: str,
    selector: dict[str, str],
    group: str,
    size: int,
    **extra: str,
) -> list[str]:
    ann = {A.gang_group: group, A.gang_min_members: str(size), **extra}
    names = [f"{group}-{i}" for i in range(size)]
    for name in names:
        core.create_namespaced_pod(ns, member(ns, name, selector, ann))
    return names


def blocks_of(pods: dict[str, Any], names: list[str]) -> set[str]:
    return {pods[n].spec.node_name.rsplit("-", 1)[1][:2] for n in names}


def has_event(core: k8s_client.CoreV1Api, ns: str, pod: str, text: str) -> bool:
    return any(text in e for e in events(core, ns, pod))


def test_topology_domains_required_preferred_and_exclusive(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    make_nodes(node_factory, ns, blocks=3, switches=2, per=2, runtime="v1.15.0")
    small = create_gang(core, ns, sel, "small", 3)
    wait_for(lambda: set(small) <= set(bound(core, ns)), 60, "small gang", describe=scheduler.text)
    assert len(blocks_of(bound(core, ns), small)) == 1  # whole inside one block
    req = create_gang(core, ns, sel, "req", 6, **{A.gang_topology: "required"})
    wait_for(
        lambda: has_event(core, ns, req[0], "topology required: no single block holds"),
        60,
        "required gang's reason",
        describe=lambda: str(events(core, ns, req[0])),
    )
    assert not set(req) & set(bound(core, ns))
    for name in req:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    pref = create_gang(core, ns, sel, "pref", 6)
    wait_for(lambda: set(pref) <= set(bound(core, ns)), 60, "preferred gang bound")
    assert len(blocks_of(bound(core, ns), pref)) == 2  # the fewest blocks that hold it
    for name in small + pref:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: not bound(core, ns), 60, "pods gone")
    # exclusive topology: each Job of the JobSet gets a block of its own
    ann = {A.gang_min_members: "4", EXCLUSIVE_TOPOLOGY: P.labels.topology_block}
    jobs = {f"ex-job{j}": [f"ex-job{j}-{i}" for i in range(2)] for j in range(2)}
    for job, names in jobs.items():
        for name in names:
            labels = {JOBSET_NAME: "ex", JOB_KEY: job}
            core.create_namespaced_pod(ns, member(ns, name, sel, ann, labels))
    every = [n for names in jobs.values() for n in names]
    wait_for(lambda: set(every) <= set(bound(core, ns)), 60, "exclusive JobSet bound")
    pods = bound(core, ns)
    per_job = [blocks_of(pods, names) for names in jobs.values()]
    assert all(len(b) == 1 for b in per_job)
    assert per_job[0] != per_job[1]


def test_timeout_releases_devices_and_competing_gangs_never_deadlock(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    make_nodes(node_factory, ns, blocks=1, switches=3, per=2, runtime="v1.15.0")
    # a gang that cannot complete: two members reserve and wait, the third never fits
    ann = {A.gang_group: "t", A.gang_min_members: "3", A.gang_timeout_seconds: "4"}
    for i in range(2):
        core.create_namespaced_pod(ns, member(ns, f"t-{i}", sel, ann))
    core.create_namespaced_pod(ns, member(ns, "t-2", {**sel, "nowhere": "x"}, ann))
    wait_for(
        lambda: has_event(core, ns, "t-0", "members reserved, waiting up to"),
        60,
        "a member waiting at Permit",
        describe=lambda: str(events(core, ns, "t-0")),
    )
    wait_for(
        lambda: (
            has_event(core, ns, "t-0", "released every reserved member")
            or has_event(core, ns, "t-1", "released every reserved member")
        ),
        60,
        "the gang released at its timeout",
        describe=lambda: str(events(core, ns, "t-0") + events(core, ns, "t-1")),
    )
    assert not bound(core, ns)
    for i in range(3):
        core.delete_namespaced_pod(f"t-{i}", ns, grace_period_seconds=0)
    # four gangs of two 8-GPU pods on six nodes: three go whole, one waits, nothing partial
    gangs = {f"g{k}": [f"g{k}-{i}" for i in range(2)] for k in range(4)}
    for i in range(2):
        for g, names in gangs.items():
            ga = {A.gang_group: g, A.gang_min_members: "2"}
            core.create_namespaced_pod(ns, member(ns, names[i], sel, ga))

    def whole() -> list[str]:
        b = bound(core, ns)
        return [g for g, names in gangs.items() if all(n in b for n in names)]

    wait_for(lambda: len(whole()) == 3, 90, "three whole gangs", describe=scheduler.text)
    (left,) = [g for g in gangs if g not in whole()]
    b = bound(core, ns)
    assert not any(n in b for n in gangs[left])
    assert len(b) == 6  # the devices freed at the timeout were used
    wait_for(
        lambda: has_event(core, ns, gangs[left][0], "no room for the 2 still to place"),
        60,
        "the waiting gang's reason",
        describe=lambda: str(events(core, ns, gangs[left][0])),
    )


def test_member_rejoins_and_restart_while_waiting_binds_nothing(
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    make_nodes(node_factory, ns, blocks=1, switches=2, per=3, runtime="v1.15.0")
    r = create_gang(core, ns, sel, "r", 3)
    wait_for(lambda: set(r) <= set(bound(core, ns)), 60, "gang bound", describe=scheduler.text)
    wait_for(
        lambda: all(p.status.phase == "Running" for p in bound(core, ns).values()),
        60,
        "members running (KWOK)",
    )
    core.delete_namespaced_pod("r-1", ns, grace_period_seconds=0)
    wait_for(
        lambda: "r-1" not in {p.metadata.name for p in core.list_namespaced_pod(ns).items},
        30,
        "member gone",
    )
    ann = {A.gang_group: "r", A.gang_min_members: "3"}
    uid = core.create_namespaced_pod(ns, member(ns, "r-1", sel, ann)).metadata.uid
    wait_for(lambda: "r-1" in bound(core, ns), 60, "recreated member rejoins its gang")
    assert (
        not [  # completes the running gang at once: no wait at Permit
            e
            for e in core.list_namespaced_event(ns).items
            if e.involved_object.uid == uid and e.reason == "GangWaiting"
        ]
    )
    # a gang waiting at Permit when the scheduler dies: nothing of it is bound afterwards
    wa = {A.gang_group: "w", A.gang_min_members: "3", A.gang_timeout_seconds: "300"}
    for i in range(2):
        core.create_namespaced_pod(ns, member(ns, f"w-{i}", sel, wa))
    core.create_namespaced_pod(ns, member(ns, "w-2", {**sel, "nowhere": "x"}, wa))
    wait_for(
        lambda: (
            has_event(core, ns, "w-1", "2/3 members reserved")
            or has_event(core, ns, "w-0", "2/3 members reserved")
        ),
        60,
        "two members waiting at Permit",
        describe=lambda: str(events(core, ns, "w-0") + events(core, ns, "w-1")),
    )
    scheduler.kill()
    replacement = SchedulerProcess(control_plane.kubeconfig_path, f"lj-{ns}").start()
    try:
        wait_for(
            lambda: "cache synced" in replacement.text(),
            60,
            "replacement synced",
            describe=replacement.text,
        )
        names = {f"w-{i}" for i in range(3)}
        assert not names & set(bound(core, ns))
        core.delete_namespaced_pod("w-2", ns, grace_period_seconds=0)
        wait_for(
            lambda: "w-2" not in {p.metadata.name for p in core.list_namespaced_pod(ns).items},
            30,
            "w-2 gone",
        )
        assert not names & set(bound(core, ns))
        core.create_namespaced_pod(ns, member(ns, "w-2", sel, wa))
        wait_for(
            lambda: names <= set(bound(core, ns)),
            60,
            "the completed gang bound whole",
            describe=replacement.text,
        )
    finally:
        replacement.stop()


def test_feature_gate_off_and_bad_group_definitions(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    make_nodes(node_factory, ns, blocks=2, switches=1, per=2, runtime="v1.14.0")
    old = create_gang(core, ns, sel, "old", 3, **{A.gang_topology: "required"})
    wait_for(lambda: set(old) <= set(bound(core, ns)), 60, "gang bound without topology")

    # said once, on the member whose cycle made the plan; a waiting member's GangWaiting says so
    def planners() -> list[str]:
        return [p for p in old if has_event(core, ns, p, "GangTopologyOff")]

    wait_for(planners, 30, "GangTopologyOff", describe=lambda: str(events(core, ns, old[0])))
    (planner,) = planners()
    assert has_event(core, ns, planner, "GangPlanned")
    assert has_event(core, ns, planner, "GangTopologyOff: topology-aware gang placement is off")
    assert has_event(core, ns, planner, "feature topology-gang needs v1.15.0")
    waiting = [e for p in old for e in events(core, ns, p) if e.startswith("GangWaiting")]
    assert waiting
    assert all("placed without topology" in e for e in waiting)
    bad: dict[str, tuple[dict[str, str], dict[str, str], str]] = {
        "nomin": ({A.gang_group: "x"}, {}, "has no minimum: set annotation"),
        "notint": ({A.gang_group: "x", A.gang_min_members: "two"}, {}, "must be an integer"),
        "huge": (
            {A.gang_group: "y", A.gang_min_members: "100000"},
            {},
            "the whole cluster could hold at most",
        ),
        "topo": (
            {A.gang_group: "z", A.gang_min_members: "1", A.gang_topology: "rack"},
            {},
            "must be one of required, preferred",
        ),
        "jobset": ({}, {JOBSET_NAME: "nojs"}, "is the JobSet CRD installed?"),
    }
    for name, (ann, labels, _) in bad.items():
        core.create_namespaced_pod(ns, member(ns, name, sel, ann, labels))
    for name, (_, _, text) in bad.items():
        wait_for(
            lambda name=name, text=text: has_event(core, ns, name, text),  # type: ignore[misc]
            60,
            f"reason of {name}",
            describe=lambda name=name: str(events(core, ns, name)),  # type: ignore[misc]
        )
    assert not set(bad) & set(bound(core, ns))


def test_require_jobset_without_the_jobset_api_exits_with_one_line(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        json.dumps(
            {
                "apiVersion": "scheduler.lingjun.com/v1",
                "kind": "LjSchedulerConfiguration",
                "profiles": [
                    {"pluginConfig": [{"name": "Coscheduling", "args": {"requireJobSet": True}}]}
                ],
            }
        )
    )
    s = SchedulerProcess(control_plane.kubeconfig_path, "lj-jobset", f"--config={cfg}").start()
    assert s.proc is not None
    assert s.proc.wait(60) == 1
    assert "args.requireJobSet is true but the JobSet API" in s.text()
    assert "Traceback" not in s.text()
