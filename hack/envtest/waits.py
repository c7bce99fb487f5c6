"""Waits on Kubernetes objects for tests: Job conditions, Job pods, pod conditions."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s_client

from lj_runtimekit.testkit.waits import wait_for


def job_condition(batch: k8s_client.BatchV1Api, namespace: str, name: str, kind: str) -> Any:
    """The Job's condition of type `kind` when True, else None."""
    job = batch.read_namespaced_job_status(name, namespace)
    for condition in (job.status and job.status.conditions) or []:
        if condition.type == kind and condition.status == "True":
            return condition
    return None


def wait_job_condition(
    batch: k8s_client.BatchV1Api, namespace: str, name: str, kind: str, timeout_s: float = 60
) -> Any:
    """Waits for the Job condition `kind` (Complete, Failed) and returns it."""
    wait_for(
        lambda: job_condition(batch, namespace, name, kind) is not None,
        timeout_s,
        f"Job {namespace}/{name} condition {kind}",
        describe=lambda: str(batch.read_namespaced_job_status(name, namespace).status),
    )
    return job_condition(batch, namespace, name, kind)


def job_pods(core: k8s_client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    """Pods of a Job (by the job-name label)."""
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={name}"
    )
    return list(pods.items)


def pod_condition(core: k8s_client.CoreV1Api, namespace: str, name: str, kind: str) -> Any:
    """The pod's condition of type `kind` (any status), else None."""
    pod = core.read_namespaced_pod_status(name, namespace)
    for condition in (pod.status and pod.status.conditions) or []:
        if condition.type == kind:
            return condition
    return None
