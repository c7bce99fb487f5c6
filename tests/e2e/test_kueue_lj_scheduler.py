"""Kueue admits, lj-scheduler places: both on one control plane (docs/kueue.md).

The bed of hack/sandbox/bench_kueue.py: an envtest control plane without kube-scheduler,
two H200 KWOK nodes and an A100 one, all with the device inventory annotation (device-
plugin mode), Kueue's manager with the queue of docs/examples/kueue-gpu-queue.yaml applied
as it is (8 whole GPUs and slices worth 4 GPUs, on a ResourceFlavor whose nodeLabels
select the H200 nodes), and lj-scheduler. Pods over the quota wait at Kueue's gate and are
never tried by lj-scheduler; admitted ones are placed on devices of the H200 nodes only
(the node selector Kueue injected); a pod group that is also an lj-scheduler gang is
admitted whole and placed whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.pytest_plugin import _tools_or_skip
from lj_runtimekit.proto.pkg.protocol import decode_assignment, load_protocol
from lj_runtimekit.sandbox.bench_kueue import (
    FLAVOR_MODEL,
    NAMESPACE,
    KueueBed,
    kueue_bed,
    queued_pod,
)
from lj_runtimekit.testkit.invariant import Holding, sharing_violations
from lj_runtimekit.testkit.kueue import PodTimeline, gated, workload_condition
from lj_runtimekit.testkit.scheduler.process import bound_pods, pod_events
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

P = load_protocol()
GPU, CORE, MEMORY = P.resources.gpu, P.resources.core, P.resources.memory
MODEL_LABEL = P.labels.device_model
TIMEOUT_S = 60
SCHEDULING_EVENTS = ("FailedScheduling", "Scheduled")
"""Reasons of the events a scheduler writes on a pod it tried."""


@pytest.fixture(scope="module")
def bed(request: pytest.FixtureRequest) -> Iterator[KueueBed]:
    binary = _tools_or_skip(("kueue",))["kueue"]
    failed_before = request.session.testsfailed
    with kueue_bed(binary) as started:
        yield started
        started.failed = request.session.testsfailed > failed_before


@pytest.fixture
def timeline(bed: KueueBed) -> Iterator[PodTimeline]:
    """The pods of the queue's namespace watched; afterwards they are deleted and the
    ClusterQueue is empty again."""
    with PodTimeline(bed.api, NAMESPACE) as watched:
        yield watched
    bed.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    wait_for(
        lambda: not bed.core.list_namespaced_pod(NAMESPACE).items,
        TIMEOUT_S,
        f"the pods of {NAMESPACE} gone",
    )


def _create(bed: KueueBed, *manifests: dict[str, Any]) -> None:
    for manifest in manifests:
        bed.core.create_namespaced_pod(NAMESPACE, manifest)


def _placed(bed: KueueBed, count: int) -> dict[str, k8s_client.V1Pod]:
    """Waits until `count` pods are bound; them, each checked to be on an H200 node with
    the node selector Kueue injected and lj-scheduler's device assignment, no device
    given twice."""
    wait_for(
        lambda: len(bound_pods(bed.core, NAMESPACE)) >= count,
        TIMEOUT_S,
        f"{count} pods bound",
        describe=lambda: (
            f"{sorted(bound_pods(bed.core, NAMESPACE))}; {bed.scheduler.text()[-2000:]}"
        ),
    )
    bed.check_running()
    pods: dict[str, k8s_client.V1Pod] = bound_pods(bed.core, NAMESPACE)
    assert len(pods) == count, sorted(pods)
    holdings: list[Holding] = []
    for name, pod in pods.items():
        assert pod.spec.node_name in bed.flavor_nodes, (name, pod.spec.node_name)
        assert (pod.spec.node_selector or {}).get(MODEL_LABEL) == FLAVOR_MODEL, name
        text = (pod.metadata.annotations or {}).get(P.annotations.assigned_devices)
        assert text, f"{name} bound without lj-scheduler's device assignment"
        holdings += [
            (pod.spec.node_name, name, share)
            for shares in decode_assignment(text).values()
            for share in shares
        ]
    assert sharing_violations("assignments", holdings) == []
    return pods


def _waiting(bed: KueueBed, name: str) -> dict[str, Any]:
    """Waits until Kueue found no quota for the pod; its QuotaReserved condition, the pod
    checked to be still gated, unbound and never tried by lj-scheduler."""

    def pending() -> dict[str, Any] | NotYet:
        reserved = workload_condition(bed.api, NAMESPACE, name, "QuotaReserved")
        if reserved is None or reserved["status"] != "False":
            return NotYet(f"{name}: QuotaReserved {reserved}")
        return reserved

    reserved = wait_for(pending, TIMEOUT_S, f"{name}'s Workload pending")
    pod = bed.core.read_namespaced_pod(name, NAMESPACE)
    assert gated(pod), name
    assert not pod.spec.node_name, name
    tried = [e for e in pod_events(bed.core, NAMESPACE, name) if e.startswith(SCHEDULING_EVENTS)]
    assert tried == [], f"lj-scheduler tried the gated pod {name}"
    return reserved


def test_over_quota_whole_gpu_pods_wait_gated_and_admitted_ones_go_to_the_flavors_nodes(
    bed: KueueBed, timeline: PodTimeline
) -> None:
    _create(bed, *(queued_pod(f"whole-{i}", {GPU: "2"}) for i in range(4)))
    first = _placed(bed, 4)
    _create(bed, queued_pod("whole-4", {GPU: "2"}))
    reserved = _waiting(bed, "whole-4")
    assert "insufficient unused quota" in reserved["message"]
    assert GPU in reserved["message"]
    # the A100 node has 8 free GPUs: only the quota and the flavor keep whole-4 off it
    assert {pod.spec.node_name for pod in first.values()}.isdisjoint(bed.other_nodes)

    bed.core.delete_namespaced_pod("whole-0", NAMESPACE, grace_period_seconds=0)
    wait_for(lambda: "whole-4" in bound_pods(bed.core, NAMESPACE), TIMEOUT_S, "whole-4 bound")
    _placed(bed, 4)
    assert timeline.ungated["whole-4"] <= timeline.bound["whole-4"]


def test_slices_count_against_the_percentage_quota(bed: KueueBed, timeline: PodTimeline) -> None:
    half = {CORE: "50", MEMORY: "50"}
    _create(bed, *(queued_pod(f"slice-{i}", half) for i in range(8)))
    pods = _placed(bed, 8)
    for pod in pods.values():
        text = pod.metadata.annotations[P.annotations.assigned_devices]
        assert [s.core_percent for s in decode_assignment(text)["main"]] == [50]
    _create(bed, queued_pod("slice-8", half))
    reserved = _waiting(bed, "slice-8")
    assert CORE in reserved["message"] or MEMORY in reserved["message"]

    bed.core.delete_namespaced_pod("slice-0", NAMESPACE, grace_period_seconds=0)
    wait_for(lambda: "slice-8" in bound_pods(bed.core, NAMESPACE), TIMEOUT_S, "slice-8 bound")


def test_a_pod_group_and_gang_is_admitted_whole_and_placed_whole(
    bed: KueueBed, timeline: PodTimeline
) -> None:
    _create(bed, queued_pod("blocker", {GPU: "2"}))
    _placed(bed, 1)
    members = [f"gang-{i}" for i in range(4)]
    _create(bed, *(queued_pod(name, {GPU: "2"}, group=("gang", 4)) for name in members))
    reserved = _waiting(bed, members[0])
    assert "insufficient unused quota" in reserved["message"]
    for name in members[1:]:
        _waiting(bed, name)

    bed.core.delete_namespaced_pod("blocker", NAMESPACE, grace_period_seconds=0)
    pods = _placed(bed, 4)
    assert sorted(pods) == members
    assert timeline.partial_groups == set()
    admitted = [timeline.ungated[name] for name in members]
    assert max(admitted) <= min(timeline.bound[name] for name in members), (
        "a member was bound before the last one was ungated"
    )
