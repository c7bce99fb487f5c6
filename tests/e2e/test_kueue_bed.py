"""Kueue admits GPU pods against a ClusterQueue's quota on a real control plane.

A control plane without kube-scheduler and nodes, and Kueue's manager (built by
hack/k8s-tools.sh at KUEUE_VERSION) with its pod integration in the tests' namespaces.
Each test has a ClusterQueue of 4 GPUs (and 8 CPUs) of one ResourceFlavor and a
LocalQueue in its namespace. Kueue holds every queued pod at its scheduling gate until
the pod's Workload is admitted; the pods never run (nothing schedules them), so only the
gates and the Workloads are checked.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.envtest.pytest_plugin import _tools_or_skip
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.kueue import (
    API_VERSION,
    GROUP,
    POD_GROUP_COUNT_ANNOTATION,
    POD_GROUP_LABEL,
    QUEUE_LABEL,
    Kueue,
    gated,
    workload_condition,
)
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

GPU = load_protocol().resources.gpu
FLAVOR = "lj-gpu"
TIMEOUT_S = 30
_NAMESPACES = itertools.count(1)


@pytest.fixture(scope="module")
def kueue(k8s_tools: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[Kueue]:
    """Kueue on a control plane of its own, with the ResourceFlavor of every test."""
    binary = _tools_or_skip(("kueue",))["kueue"]
    plane = ControlPlane(ControlPlaneConfig(scheduler=False, kwok=False)).start()
    failed_before = request.session.testsfailed
    try:
        with Kueue(plane, binary) as started:
            k8s_client.CustomObjectsApi(started.api).create_cluster_custom_object(
                GROUP,
                API_VERSION,
                "resourceflavors",
                {"apiVersion": f"{GROUP}/{API_VERSION}", "kind": "ResourceFlavor"}
                | {"metadata": {"name": FLAVOR}},
            )
            yield started
    finally:
        plane.stop(failed=request.session.testsfailed > failed_before)


@dataclass
class Queue:
    """A namespace Kueue manages, its LocalQueue and the ClusterQueue behind it (both named
    as the namespace)."""

    kueue: Kueue
    namespace: str

    @property
    def core(self) -> k8s_client.CoreV1Api:
        return k8s_client.CoreV1Api(self.kueue.api)

    @property
    def custom(self) -> k8s_client.CustomObjectsApi:
        return k8s_client.CustomObjectsApi(self.kueue.api)

    def pod(self, name: str, gpus: int, group: tuple[str, int] | None = None) -> None:
        """A pod in the LocalQueue asking `gpus` GPUs and a CPU; `group`: (name, total
        count) of the pod group it belongs to."""
        labels = {QUEUE_LABEL: self.namespace}
        annotations = {}
        if group is not None:
            labels[POD_GROUP_LABEL] = group[0]
            annotations[POD_GROUP_COUNT_ANNOTATION] = str(group[1])
        limits = {GPU: str(gpus), "cpu": "1"}
        container = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
        self.core.create_namespaced_pod(
            self.namespace,
            {
                "metadata": {"name": name, "labels": labels, "annotations": annotations},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
            },
        )

    def gated(self, name: str) -> bool:
        """Whether the pod still has Kueue's scheduling gate."""
        return gated(self.core.read_namespaced_pod(name, self.namespace))

    def workload_of(self, pod_name: str) -> dict[str, Any] | None:
        """The Workload Kueue made for the pod (the one it owns)."""
        uid = self.core.read_namespaced_pod(pod_name, self.namespace).metadata.uid
        listed = self.custom.list_namespaced_custom_object(
            GROUP, API_VERSION, self.namespace, "workloads"
        )
        for workload in listed["items"]:
            owners = workload["metadata"].get("ownerReferences", [])
            if any(o["uid"] == uid for o in owners):
                return dict(workload)
        return None

    def condition(self, pod_name: str, kind: str) -> dict[str, Any] | None:
        """The pod's Workload's condition `kind` (None before there is one)."""
        return workload_condition(self.kueue.api, self.namespace, pod_name, kind)

    def admitted(self, *pods: str) -> bool | NotYet:
        """All `pods` ungated and their Workloads Admitted."""
        for name in pods:
            admitted = self.condition(name, "Admitted")
            if admitted is None or admitted["status"] != "True":
                return NotYet(f"{name}: Workload Admitted condition {admitted}")
            if self.gated(name):
                return NotYet(f"{name}: Workload admitted, pod still gated")
        return True

    def pending(self, pod_name: str) -> dict[str, Any] | NotYet:
        """The QuotaReserved=False condition of the pod's Workload once Kueue tried it."""
        reserved = self.condition(pod_name, "QuotaReserved")
        if reserved is None or reserved["status"] != "False":
            return NotYet(f"{pod_name}: Workload QuotaReserved condition {reserved}")
        return reserved

    def counts(self) -> tuple[int, int, int]:
        """(reserving, admitted, pending) Workloads in the ClusterQueue's status."""
        cq = self.custom.get_cluster_custom_object(
            GROUP, API_VERSION, "clusterqueues", self.namespace
        )
        status = cq.get("status", {})
        keys = ("reservingWorkloads", "admittedWorkloads", "pendingWorkloads")
        reserving, admitted, pending = (int(status.get(k, 0)) for k in keys)
        return reserving, admitted, pending

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)


@pytest.fixture
def queue(kueue: Kueue) -> Iterator[Queue]:
    """A fresh managed namespace with its ClusterQueue (4 GPUs) and LocalQueue."""
    name = f"kueue-{next(_NAMESPACES)}"
    out = Queue(kueue, name)
    out.core.create_namespace({"metadata": {"name": name}})
    kueue.manage(name)
    wait_for(
        lambda: (
            out.core.list_namespaced_service_account(
                name, field_selector="metadata.name=default"
            ).items
        ),
        TIMEOUT_S,
        f"ServiceAccount default in {name}",
    )
    resources = [
        {"name": "cpu", "nominalQuota": "8"},
        {"name": GPU, "nominalQuota": "4"},
    ]
    cluster_queue = {
        "apiVersion": f"{GROUP}/{API_VERSION}",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", GPU],
                    "flavors": [{"name": FLAVOR, "resources": resources}],
                }
            ],
        },
    }
    out.custom.create_cluster_custom_object(GROUP, API_VERSION, "clusterqueues", cluster_queue)
    local_queue = {
        "apiVersion": f"{GROUP}/{API_VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": name},
        "spec": {"clusterQueue": name},
    }
    out.custom.create_namespaced_custom_object(GROUP, API_VERSION, name, "localqueues", local_queue)
    kueue.wait_local_queue_active(name, name, TIMEOUT_S)
    yield out
    out.core.delete_namespace(name)
    out.custom.delete_cluster_custom_object(GROUP, API_VERSION, "clusterqueues", name)


def test_pods_within_the_quota_are_admitted_and_the_next_waits_for_room(queue: Queue) -> None:
    queue.pod("first", gpus=2)
    queue.pod("second", gpus=2)
    wait_for(lambda: queue.admitted("first", "second"), TIMEOUT_S, "first and second admitted")

    queue.pod("third", gpus=2)
    pending = wait_for(lambda: queue.pending("third"), TIMEOUT_S, "third's Workload pending")
    assert pending["reason"] == "Pending"
    assert "insufficient unused quota" in pending["message"]
    assert GPU in pending["message"]
    assert queue.gated("third")
    admitted = queue.condition("third", "Admitted")
    assert admitted is None or admitted["status"] == "False", admitted

    queue.delete("first")
    wait_for(lambda: queue.admitted("third"), TIMEOUT_S, "third admitted once first is gone")
    assert queue.admitted("second")


def test_a_pod_group_larger_than_the_room_left_waits_whole(queue: Queue) -> None:
    queue.pod("blocker", gpus=2)
    wait_for(lambda: queue.admitted("blocker"), TIMEOUT_S, "blocker admitted")

    members = ("trio-0", "trio-1", "trio-2")
    for name in members:
        queue.pod(name, gpus=1, group=("trio", len(members)))
    pending = wait_for(lambda: queue.pending("trio-0"), TIMEOUT_S, "the group's Workload pending")
    assert "insufficient unused quota" in pending["message"]
    workloads = set()
    for name in members:
        workload = queue.workload_of(name)
        assert workload is not None, f"{name} has no Workload"
        workloads.add(workload["metadata"]["name"])
    assert len(workloads) == 1, f"one Workload for the whole group, not {workloads}"
    wait_for(
        lambda: queue.counts() == (1, 1, 1),
        TIMEOUT_S,
        "the ClusterQueue holding the blocker alone, the group pending",
        describe=queue.counts,
    )
    assert [name for name in members if not queue.gated(name)] == []

    queue.delete("blocker")
    wait_for(lambda: queue.admitted(*members), TIMEOUT_S, "the whole group admitted")
