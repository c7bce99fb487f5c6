"""KWOK nodes from the factory report the Lingjun GPU resources."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit.envtest import NodeFactory, Taint
from lj_runtimekit.testkit.waits import wait_for

pytestmark = pytest.mark.controlplane


def test_factory_node_is_ready_and_reports_gpu_resources(
    node_factory: NodeFactory, api_client: k8s_client.ApiClient
) -> None:
    name = node_factory.create(
        f"{node_factory.group}-gpu",
        gpus=4,
        topology_block="block-a",
        topology_switch="sw-1",
        taints=[Taint("lingjun.com/dedicated", "NoSchedule", "training")],
    )
    node = k8s_client.CoreV1Api(api_client).read_node(name)

    for resources in (node.status.capacity, node.status.allocatable):
        assert resources["alibabacloud.com/gpu"] == "4"
        assert resources["alibabacloud.com/gpu-core.percentage"] == "400"
        assert resources["alibabacloud.com/gpu-memory.percentage"] == "400"
        assert resources["cpu"] == "96"
        assert resources["pods"] == "110"
    labels = node.metadata.labels
    assert labels["lj_runtimekit_enable"] == "true"
    assert labels["lingjun.com/device-count"] == "4"
    assert labels["lingjun.com/device-model"] == "H200"
    assert labels["lingjun.com/topology-block"] == "block-a"
    assert labels["lingjun.com/topology-switch"] == "sw-1"
    assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]
    assert node.status.node_info.kubelet_version.startswith("kwok-")
    taints = {(t.key, t.value, t.effect) for t in node.spec.taints}
    assert ("lingjun.com/dedicated", "training", "NoSchedule") in taints


def test_node_without_enable_label_or_gpus(
    node_factory: NodeFactory, api_client: k8s_client.ApiClient
) -> None:
    name = node_factory.create(f"{node_factory.group}-cpu", gpus=0, enable=False)
    node = k8s_client.CoreV1Api(api_client).read_node(name)
    assert "alibabacloud.com/gpu" not in node.status.allocatable
    assert "lj_runtimekit_enable" not in node.metadata.labels


def test_a_node_renews_its_lease_without_rewriting_its_status(
    node_factory: NodeFactory, api_client: k8s_client.ApiClient
) -> None:
    """Like a kubelet with a node lease: KWOK renews the lease every 10 s and leaves the
    status alone meanwhile (its lease-less heartbeat rewrote it every 20 to 25 s)."""
    core = k8s_client.CoreV1Api(api_client)
    leases = k8s_client.CoordinationV1Api(api_client)
    name = node_factory.create(f"{node_factory.group}-lease", gpus=1)

    def ready_heartbeat() -> object:
        for condition in core.read_node_status(name).status.conditions or []:
            if condition.type == "Ready":
                return condition.last_heartbeat_time
        raise AssertionError(f"node {name} has no Ready condition")

    heartbeat = ready_heartbeat()
    renewals: list[object] = []

    def renewed_three_times() -> bool:
        renew = leases.read_namespaced_lease(name, "kube-node-lease").spec.renew_time
        if not renewals or renewals[-1] != renew:
            renewals.append(renew)
        return len(renewals) > 3  # the first is the lease as found

    # three renewals take about 30 s: past the 25 s of the lease-less heartbeat
    wait_for(
        renewed_three_times,
        90,
        f"three renewals of node {name}'s lease",
        interval_s=1.0,
        describe=lambda: renewals,
        ignore=(ApiException,),
    )
    assert ready_heartbeat() == heartbeat
