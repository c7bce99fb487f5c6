"""Kueue admits, lj-scheduler places: both on one control plane (docs/kueue.md).

Device-plugin mode (`TestDevicePluginMode`): the bed of hack/sandbox/bench_kueue.py, an
envtest control plane without kube-scheduler, two H200 KWOK nodes and an A100 one, all
with the device inventory annotation, Kueue's manager with the queue of
docs/examples/kueue-gpu-queue.yaml applied as it is (8 whole GPUs and slices worth 4 GPUs,
on a ResourceFlavor whose nodeLabels select the H200 nodes), and lj-scheduler. Pods over
the quota wait at Kueue's gate and are never tried by lj-scheduler; admitted ones are
placed on devices of the H200 nodes only (the node selector Kueue injected); a pod group
that is also an lj-scheduler gang is admitted whole and placed whole.

DRA mode: the DRA bed of conftest.py (`dra_cluster`), its control plane started after the
device-plugin one is gone, with Kueue configured by docs/examples/kueue-dra-config.yaml
(its DynamicResourceAllocation gate and DeviceClass mappings) and the queue of
docs/examples/kueue-dra-queue.yaml: claims from templates count against the quota, the
admitted pods' claims are allocated by lj-scheduler, a pod with a named ResourceClaim is
inadmissible.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from lj_runtimekit.deviceplugin.internal.dra import naming
from lj_runtimekit.envtest.controlplane import DRA_VERSION
from lj_runtimekit.envtest.pytest_plugin import _tools_or_skip
from lj_runtimekit.proto.pkg.protocol import decode_assignment, load_protocol
from lj_runtimekit.sandbox.bench_kueue import (
    FLAVOR_MODEL,
    NAMESPACE,
    ROOT,
    SCHEDULER,
    KueueBed,
    kueue_bed,
    queued_pod,
)
from lj_runtimekit.testkit.dra import (
    RESOURCE_API,
    DraCluster,
    DraSpace,
    check_sharing_invariant,
    claim_pod,
    exactly,
    example_devices,
)
from lj_runtimekit.testkit.invariant import Holding, sharing_violations
from lj_runtimekit.testkit.kueue import (
    QUEUE_LABEL,
    SCHEDULING_GATE,
    KubeconfigPlane,
    Kueue,
    PodTimeline,
    gated,
    workload_condition,
)
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess, bound_pods, pod_events
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

P = load_protocol()
GPU, CORE, MEMORY = P.resources.gpu, P.resources.core, P.resources.memory
MODEL_LABEL = P.labels.device_model
TIMEOUT_S = 60
SCHEDULING_EVENTS = ("FailedScheduling", "Scheduled")
"""Reasons of the events a scheduler writes on a pod it tried."""


@pytest.fixture(scope="class")
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


def _live_bound(bed: KueueBed) -> dict[str, k8s_client.V1Pod]:
    """The bound pods of the queue's namespace that are not being deleted."""
    pods = bound_pods(bed.core, NAMESPACE).items()
    return {name: pod for name, pod in pods if pod.metadata.deletion_timestamp is None}


def _placed(bed: KueueBed, count: int) -> dict[str, k8s_client.V1Pod]:
    """Waits until `count` pods (not being deleted) are bound; them, each checked to be on
    an H200 node with the node selector Kueue injected and lj-scheduler's device
    assignment, no device given twice."""
    wait_for(
        lambda: len(_live_bound(bed)) >= count,
        TIMEOUT_S,
        f"{count} pods bound",
        describe=lambda: f"{sorted(_live_bound(bed))}; {bed.scheduler.text()[-2000:]}",
    )
    bed.check_running()
    pods = _live_bound(bed)
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


def _not_reserved(api: k8s_client.ApiClient, name: str) -> dict[str, Any]:
    """Waits until Kueue tried the pod's Workload and reserved no quota; that condition."""

    def pending() -> dict[str, Any] | NotYet:
        reserved = workload_condition(api, NAMESPACE, name, "QuotaReserved")
        if reserved is None or reserved["status"] != "False":
            return NotYet(f"{name}: QuotaReserved {reserved}")
        return reserved

    return wait_for(pending, TIMEOUT_S, f"{name}'s Workload without quota")


def _waiting(bed: KueueBed, name: str) -> dict[str, Any]:
    """Waits until Kueue found no quota for the pod; its QuotaReserved condition, the pod
    checked to be still gated, unbound and never tried by lj-scheduler."""
    reserved = _not_reserved(bed.api, name)
    pod = bed.core.read_namespaced_pod(name, NAMESPACE)
    assert gated(pod), name
    assert not pod.spec.node_name, name
    tried = [e for e in pod_events(bed.core, NAMESPACE, name) if e.startswith(SCHEDULING_EVENTS)]
    assert tried == [], f"lj-scheduler tried the gated pod {name}"
    return reserved


class TestDevicePluginMode:
    """Kueue and lj-scheduler on KWOK nodes with the device inventory annotation."""

    def test_over_quota_whole_gpu_pods_wait_gated_and_admitted_ones_go_to_the_flavors_nodes(
        self, bed: KueueBed, timeline: PodTimeline
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

    def test_slices_count_against_the_percentage_quota(
        self, bed: KueueBed, timeline: PodTimeline
    ) -> None:
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
        self, bed: KueueBed, timeline: PodTimeline
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


DRA_CONFIG = yaml.safe_load((ROOT / "docs" / "examples" / "kueue-dra-config.yaml").read_text())
DRA_QUEUE = ROOT / "docs" / "examples" / "kueue-dra-queue.yaml"
DRA_MAPPINGS = {
    m["name"]: m["deviceClassNames"] for m in DRA_CONFIG["resources"]["deviceClassMappings"]
}
WHOLE_CLASS, SHARE_CLASS = P.dra.whole_class("gpu"), P.dra.share_class("gpu")
(WHOLE_QUOTA,) = (name for name, classes in DRA_MAPPINGS.items() if classes == [WHOLE_CLASS])
(SHARE_QUOTA,) = (name for name, classes in DRA_MAPPINGS.items() if classes == [SHARE_CLASS])
DRA_LOCAL_QUEUE = "gpu-dra"


@pytest.fixture(scope="module")
def dra_kueue(dra_cluster: DraCluster) -> Iterator[Kueue]:
    """Kueue configured as kueue-dra-config.yaml says, the DRA queue applied, and
    lj-scheduler, on the DRA bed."""
    tools = _tools_or_skip(("kueue", "kubectl"), DRA_VERSION)
    plane = KubeconfigPlane(Path(dra_cluster.kubeconfig), tools["kubectl"])
    with Kueue(
        plane,
        tools["kueue"],
        feature_gates=DRA_CONFIG["featureGates"],
        device_class_mappings=DRA_MAPPINGS,
    ) as kueue:
        kueue.apply(DRA_QUEUE)
        kueue.manage(NAMESPACE)
        kueue.wait_local_queue_active(NAMESPACE, DRA_LOCAL_QUEUE)
        scheduler = SchedulerProcess(dra_cluster.kubeconfig, SCHEDULER).start()
        try:
            yield kueue
        finally:
            scheduler.stop()


def _queued_claim_pod(
    space: DraSpace,
    name: str,
    claims: Mapping[str, str] | None = None,
    named: Mapping[str, str] | None = None,
) -> None:
    """A pod of the DRA queue whose container uses its pod claims: from templates
    (`claims`: pod claim -> template) or ResourceClaims (`named`: pod claim -> claim)."""
    used = (*(claims or {}), *(named or {}))
    obj = claim_pod(
        name,
        claims or {},
        named=named,
        containers=({"main": used},),
        namespace=space.namespace,
        scheduler_name=SCHEDULER,
    )
    obj["metadata"]["labels"] = {QUEUE_LABEL: DRA_LOCAL_QUEUE}
    space.kube.request("POST", f"/api/v1/namespaces/{space.namespace}/pods", obj)


def test_dra_claims_count_against_the_queue_and_lj_scheduler_allocates_the_admitted(
    dra_cluster: DraCluster, dra_kueue: Kueue
) -> None:
    space = DraSpace(dra_cluster, NAMESPACE)
    step = naming.memory_step(example_devices("tdm-8gpu")[0])
    space.template("two", [exactly("g", WHOLE_CLASS, count=2)])
    half = {naming.CORES: "50", naming.MEMORY: str(50 * step)}
    space.template("half", [exactly("s", SHARE_CLASS, capacity=half)])
    try:
        for name in ("whole-0", "whole-1", "whole-2"):
            _queued_claim_pod(space, name, claims={"g": "two"})
        for name in ("slice-0", "slice-1", "slice-2"):
            _queued_claim_pod(space, name, claims={"s": "half"})
        # Kueue admits two of each three in its order (creation times have 1 s steps)
        left = {}
        for group in ("whole", "slice"):
            names = [f"{group}-{n}" for n in range(3)]

            def two_running(names: list[str] = names) -> list[str] | NotYet:
                running = [n for n in names if space.get(n)["status"].get("phase") == "Running"]
                return running if len(running) == 2 else NotYet(f"running: {running}")

            running = wait_for(two_running, 60, f"two of {names} running")
            (left[group],) = set(names) - set(running)
            for name in running:
                pod = space.get(name)
                assert pod["spec"]["nodeSelector"] == {P.labels.device_api: "dra"}, name
                assert [len(shares) for shares in space.claims_of(pod).values()] == [
                    2 if group == "whole" else 1
                ], name
        for name, quota in ((left["whole"], WHOLE_QUOTA), (left["slice"], SHARE_QUOTA)):
            reserved = _not_reserved(dra_kueue.api, name)
            assert f"insufficient unused quota for {quota}" in reserved["message"], reserved
            pod = space.get(name)
            gates = [g["name"] for g in pod["spec"].get("schedulingGates", [])]
            assert SCHEDULING_GATE in gates, name
            assert not pod["spec"].get("nodeName"), name
            for status in pod["status"].get("resourceClaimStatuses") or ():
                claim = space.kube.request(
                    "GET",
                    f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/"
                    f"{status['resourceClaimName']}",
                )
                assert "allocation" not in claim.get("status", {}), f"{name}'s claim allocated"

        admitted = sorted({"whole-0", "whole-1", "whole-2"} - {left["whole"]})
        space.kube.request(
            "DELETE",
            f"/api/v1/namespaces/{NAMESPACE}/pods/{admitted[0]}",
            query={"gracePeriodSeconds": "0"},
        )
        assert len(next(iter(space.claims_of(space.running(left["whole"])).values()))) == 2

        space.kube.request(
            "POST",
            f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "named"},
                "spec": {"devices": {"requests": [exactly("g", WHOLE_CLASS)]}},
            },
        )
        _queued_claim_pod(space, "named", named={"g": "named"})
        refused = _not_reserved(dra_kueue.api, "named")
        assert refused["reason"] == "Inadmissible", refused
        assert "does not support use of resource claims" in refused["message"], refused
        check_sharing_invariant(dra_cluster.shares())
    finally:
        space.clean()
