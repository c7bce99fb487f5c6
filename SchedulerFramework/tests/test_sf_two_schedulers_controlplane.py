"""Two lj-scheduler processes (profiles lj-a, lj-b) on the same nodes of a real control plane."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.schedulerframework.internal.config.config import DEFAULT_NODE_OWNER_LABEL
from lj_runtimekit.testkit.invariant import assignment_holdings, sharing_violations
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess, annotate_inventory
from lj_runtimekit.testkit.scheduler.process import pod_events as events
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("runtime_class")]
P = load_protocol()
PER_SCHEDULER = 36
"""Slice pods per scheduler: its two nodes hold 32 (8 GPUs x 2 half slices each)."""


def pods_json(core: k8s_client.CoreV1Api, namespace: str) -> list[dict[str, Any]]:
    resp = core.list_namespaced_pod(namespace, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


@pytest.fixture
def two_schedulers(
    control_plane: ControlPlane, namespace: str
) -> Iterator[tuple[SchedulerProcess, SchedulerProcess]]:
    """lj-a and lj-b, both leader-elected in the test's namespace, default Lease names."""
    procs = tuple(
        SchedulerProcess(
            control_plane.kubeconfig_path,
            f"{profile}-{namespace}",
            "--leader-elect=true",
            f"--lease-namespace={namespace}",
        ).start()
        for profile in ("lj-a", "lj-b")
    )
    yield procs[0], procs[1]
    for s in procs:
        s.stop()


def test_two_schedulers_both_lead_and_never_share_a_device(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    two_schedulers: tuple[SchedulerProcess, SchedulerProcess],
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    coord = k8s_client.CoordinationV1Api(api_client)
    a, b = f"lj-a-{namespace}", f"lj-b-{namespace}"
    nodes = [node_factory.create(f"{namespace}-n{i}", wait=False) for i in range(4)]
    node_factory.wait_ready(nodes)
    owner_of = {nodes[0]: a, nodes[1]: a, nodes[2]: b, nodes[3]: b}
    for n, owner in owner_of.items():
        annotate_inventory(core, n)
        core.patch_node(n, {"metadata": {"labels": {DEFAULT_NODE_OWNER_LABEL: owner}}})

    def holder(lease: str) -> str:
        try:
            return str(coord.read_namespaced_lease(lease, namespace).spec.holder_identity or "")
        except k8s_client.ApiException:
            return ""

    wait_for(
        lambda: holder(a) != "" and holder(b) != "",
        60,
        f"both {a} and {b} lead (a Lease each)",
        describe=lambda: two_schedulers[0].text()[-1000:] + two_schedulers[1].text()[-1000:],
    )

    # a burst of half-GPU slices from both, interleaved, to the same four nodes
    half = {P.resources.core: "50", P.resources.memory: "50"}
    for i in range(PER_SCHEDULER):
        for name in (a, b):
            core.create_namespaced_pod(
                namespace, pod(f"{name[:4]}-{i}", name, node_factory.selector, half)
            )

    def placed() -> list[dict[str, Any]]:
        return [p for p in pods_json(core, namespace) if p["spec"].get("nodeName")]

    wait_for(
        lambda: len(placed()) == 64,
        180,
        "64 slice pods bound (32 per scheduler)",
        describe=lambda: f"{len(placed())} bound; {two_schedulers[0].text()[-1500:]}",
    )
    pods = pods_json(core, namespace)
    bound = [p for p in pods if p["spec"].get("nodeName")]
    for p in bound:  # each scheduler placed only on the nodes it owns
        assert owner_of[p["spec"]["nodeName"]] == p["spec"]["schedulerName"]
    assert sharing_violations("pods", assignment_holdings(pods, P)) == []
    pending = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
    assert len(pending) == 2 * (PER_SCHEDULER - 32)
    wait_for(
        lambda: any(
            "node(s) had untolerated taint {node owned by scheduler" in e
            for e in events(core, namespace, pending[0])
        ),
        60,
        "FailedScheduling naming the other scheduler's nodes",
        describe=lambda: str(events(core, namespace, pending[0])),
    )
