"""Requeue hints with an lj-scheduler process on the real control plane."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess, annotate_inventory
from lj_runtimekit.testkit.scheduler.process import bound_pods as bound
from lj_runtimekit.testkit.scheduler.process import pod_events as events
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("runtime_class")]
GPU = load_protocol().resources.gpu


@pytest.fixture
def debug_scheduler(control_plane: ControlPlane, namespace: str) -> Iterator[SchedulerProcess]:
    s = SchedulerProcess(control_plane.kubeconfig_path, f"lj-{namespace}", "--log-level=debug")
    yield s.start()
    s.stop()


def test_node_update_without_device_change_leaves_a_pod_short_of_devices_parked(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    debug_scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel, name = namespace, node_factory.selector, f"lj-{namespace}"
    node = node_factory.create(f"{ns}-n0")
    annotate_inventory(core, node)
    core.create_namespaced_pod(
        ns, pod("full", name, sel, {GPU: "8"}, terminationGracePeriodSeconds=0)
    )
    wait_for(lambda: "full" in bound(core, ns), 60, "full bound", describe=debug_scheduler.text)
    core.create_namespaced_pod(ns, pod("waiting", name, sel, {GPU: "1"}))
    wait_for(
        lambda: any("FailedScheduling" in e for e in events(core, ns, "waiting")),
        60,
        "waiting rejected",
        describe=debug_scheduler.text,
    )
    # heartbeats (KWOK's) change nothing the scheduler reads; a label and a soft taint change
    # the node, but no plugin that rejected the pod (GpuShare here, NodeAffinity on other
    # tests' nodes) cares about them
    taint = {"key": "team", "value": "a", "effect": "PreferNoSchedule"}
    core.patch_node(node, {"metadata": {"labels": {"team": "a"}}, "spec": {"taints": [taint]}})
    for event in ("NodeLabel", "NodeTaint"):
        wait_for(
            lambda event=event: (
                f"cluster event {event} moved 0 unschedulable pod(s)"  # type: ignore[misc]
                in debug_scheduler.text()
            ),
            30,
            f"{event} seen and the pod left parked",
            describe=debug_scheduler.text,
        )
    core.delete_namespaced_pod("full", ns, grace_period_seconds=0)
    wait_for(
        lambda: "waiting" in bound(core, ns), 60, "waiting bound", describe=debug_scheduler.text
    )
    assert "cluster event AssignedPodDelete moved 1 unschedulable pod(s)" in debug_scheduler.text()
