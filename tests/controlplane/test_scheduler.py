"""The stock kube-scheduler places GPU pods only where the GPU resource is."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest import NodeFactory
from lj_runtimekit.envtest.waits import pod_condition
from lj_runtimekit.testkit.waits import wait_for

pytestmark = pytest.mark.controlplane

GPU = "alibabacloud.com/gpu"


def gpu_pod(name: str, node_selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/lj/infer:1",
                    "resources": {"limits": {GPU: "1"}},
                }
            ],
        },
    }


def test_scheduler_places_gpu_pod_on_gpu_node_and_leaves_the_other_pending(
    node_factory: NodeFactory, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    gpu_node = node_factory.create(f"{node_factory.group}-gpu", gpus=8, wait=False)
    cpu_node = node_factory.create(
        f"{node_factory.group}-cpu", gpus=0, labels={"pool": "cpu"}, wait=False
    )
    node_factory.wait_ready([gpu_node, cpu_node])
    core = k8s_client.CoreV1Api(api_client)

    # Both nodes are candidates; only one has the GPU resource.
    core.create_namespaced_pod(namespace, gpu_pod("placed", node_factory.selector))
    # Only the node without GPUs is a candidate.
    core.create_namespaced_pod(
        namespace, gpu_pod("pending", {**node_factory.selector, "pool": "cpu"})
    )

    def placed_running() -> bool:
        pod = core.read_namespaced_pod_status("placed", namespace)
        return bool(pod.status.phase == "Running")

    wait_for(
        placed_running,
        60,
        "pod placed to run on a KWOK node",
        describe=lambda: str(core.read_namespaced_pod_status("placed", namespace).status),
    )
    assert core.read_namespaced_pod("placed", namespace).spec.node_name == gpu_node

    def unschedulable() -> bool:
        condition = pod_condition(core, namespace, "pending", "PodScheduled")
        return condition is not None and condition.reason == "Unschedulable"

    wait_for(unschedulable, 60, "pod pending to be reported Unschedulable")
    condition = pod_condition(core, namespace, "pending", "PodScheduled")
    assert condition.status == "False"
    assert f"Insufficient {GPU}" in condition.message
    pending = core.read_namespaced_pod("pending", namespace)
    assert pending.spec.node_name is None
    assert pending.status.phase == "Pending"
