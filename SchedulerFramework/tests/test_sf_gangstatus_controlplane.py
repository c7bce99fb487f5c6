"""Gang state from outside: events on the members and GET /debug/gangs, on the real control
plane with an lj-scheduler process."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess
from lj_runtimekit.testkit.scheduler.process import pod_events as events
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("runtime_class")]
P = load_protocol()
A = P.annotations


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def served_scheduler(
    control_plane: ControlPlane, namespace: str, port: int
) -> Iterator[SchedulerProcess]:
    s = SchedulerProcess(control_plane.kubeconfig_path, f"lj-{namespace}", f"--metrics-port={port}")
    yield s.start()
    s.stop()


def gangs(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/gangs", timeout=5) as resp:
        assert resp.headers["Content-Type"] == "application/json"
        doc: dict[str, list[dict[str, Any]]] = json.load(resp)
        return doc["gangs"]


def has_event(core: k8s_client.CoreV1Api, ns: str, name: str, text: str) -> bool:
    return any(text in e for e in events(core, ns, name))


def test_gang_events_and_debug_endpoint(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    served_scheduler: SchedulerProcess,
    port: int,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    labels = {P.labels.runtime_version: "v1.15.0"}
    specs = [
        GpuNodeSpec(f"{ns}-n{i}", topology_block="b0", topology_switch="s0", labels=labels)
        for i in range(4)
    ]
    node_factory.wait_ready(node_factory.create_many(specs))
    ann = {A.gang_group: "w", A.gang_min_members: "3", A.gang_timeout_seconds: "8"}
    for i, selector in enumerate((sel, sel, {**sel, "nowhere": "x"})):  # the third never fits
        body = pod(f"w-{i}", f"lj-{ns}", selector, {P.resources.gpu: "8"}, annotations=ann)
        core.create_namespaced_pod(ns, body)
    wait_for(
        lambda: all(has_event(core, ns, f"w-{i}", "members reserved, waiting") for i in (0, 1)),
        60,
        "two members waiting at Permit",
        describe=lambda: str(events(core, ns, "w-0")) + served_scheduler.text(),
    )
    assert any(has_event(core, ns, f"w-{i}", "member(s) planned on") for i in range(3))
    (state,) = [g for g in gangs(port) if g["gang"] == f"{ns}/w"]
    assert state["profile"] == f"lj-{ns}"
    assert state["min_members"] == 3
    assert state["members"] == 3
    assert state["waiting"] == [f"{ns}/w-0", f"{ns}/w-1"]
    assert state["reserved"] == [f"{ns}/w-0", f"{ns}/w-1"]
    assert state["plan"] is not None
    assert 0 < state["plan"]["deadline_in_s"] <= 8
    assert state["bound"] == []
    # at the timeout the plan goes, its claims with it; the gang backs off
    wait_for(
        lambda: has_event(core, ns, "w-2", "placement plan dropped (its timeout)"),
        30,
        "plan dropped at the timeout",
        describe=lambda: str(events(core, ns, "w-2")),
    )
    (state,) = [g for g in gangs(port) if g["gang"] == f"{ns}/w"]
    assert state["plan"] is None
    assert state["claimed_nodes"] == []
    assert state["waiting"] == []
    assert state["backoff_s"] > 0
    # the same port still serves the metrics (the Deployment's probes read /metrics)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert b"lj_scheduler_schedule_attempts_total" in resp.read()
