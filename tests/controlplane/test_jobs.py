"""Jobs on KWOK nodes finish through the real Job controller."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest import NodeFactory, failure_annotations
from lj_runtimekit.envtest.waits import job_pods, wait_job_condition

pytestmark = pytest.mark.controlplane

GPU = "alibabacloud.com/gpu"


def job_manifest(
    name: str,
    node_selector: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A one-pod Job that never retries, pinned by `node_selector`."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "completions": 1,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": node_selector,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/lj/train:1",
                            "resources": {"limits": {GPU: "1"}},
                        }
                    ],
                },
            },
        },
    }


def test_job_pinned_to_kwok_node_completes(
    node_factory: NodeFactory, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    node = node_factory.create(f"{node_factory.group}-gpu", gpus=8)
    batch = k8s_client.BatchV1Api(api_client)
    core = k8s_client.CoreV1Api(api_client)
    batch.create_namespaced_job(namespace, job_manifest("train", {"kubernetes.io/hostname": node}))

    wait_job_condition(batch, namespace, "train", "Complete")

    job = batch.read_namespaced_job_status("train", namespace)
    assert job.status.succeeded == 1
    assert not job.status.failed
    (pod,) = job_pods(core, namespace, "train")
    assert pod.spec.node_name == node
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_job_fails_with_the_chosen_exit_code_and_message(
    node_factory: NodeFactory, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    node = node_factory.create(f"{node_factory.group}-gpu", gpus=8)
    batch = k8s_client.BatchV1Api(api_client)
    core = k8s_client.CoreV1Api(api_client)
    message = "CUDA error: an illegal memory access was encountered (GPU 3)"
    batch.create_namespaced_job(
        namespace,
        job_manifest(
            "crash",
            {"kubernetes.io/hostname": node},
            annotations=failure_annotations(exit_code=42, message=message),
        ),
    )

    condition = wait_job_condition(batch, namespace, "crash", "Failed")

    assert condition.reason == "BackoffLimitExceeded"
    job = batch.read_namespaced_job_status("crash", namespace)
    assert job.status.failed == 1
    assert not job.status.succeeded
    (pod,) = job_pods(core, namespace, "crash")
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 42
    assert terminated.message == message
    assert terminated.reason == "Error"
