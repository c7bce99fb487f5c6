"""DRA mode: a pod whose claim is not there waits saying so; device-plugin pods never land
on nodes labelled for DRA (allocation itself: test_sf_dra_allocator.py and the control-plane
tests)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes
from lj_runtimekit.deviceplugin.internal.dra.slices import build_slices
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, NodeDevice, encode_inventory
from lj_runtimekit.schedulerframework.internal.cache.cache import Cache
from lj_runtimekit.schedulerframework.internal.cache.podinfo import parse_pod
from lj_runtimekit.schedulerframework.internal.dra.allocator import allocate
from lj_runtimekit.schedulerframework.internal.dra.objects import allocation_to_api
from lj_runtimekit.schedulerframework.internal.extender.server import Extender
from lj_runtimekit.schedulerframework.internal.plugins.dynamicresources import claim_names
from lj_runtimekit.testkit.dra import exactly, synthetic_gpus
from lj_runtimekit.testkit.scheduler.fake import CORE, GPU, MEM, PROTOCOL, FakeCluster
from lj_runtimekit.testkit.waits import wait_for

DRA_LABEL = {PROTOCOL.labels.device_api: DRA_MODE}
NO_BACKOFF = {"podInitialBackoffSeconds": 0.001, "podMaxBackoffSeconds": 0.001}
MakeCluster = Callable[[Mapping[str, Any] | None], FakeCluster]
CLAIMS = [{"name": "gpu", "resourceClaimName": "train-gpu"}]


def stale_inventory(count: int = 8) -> dict[str, str]:
    """The inventory annotation a node kept from its Device Plugin days."""
    devices = tuple(NodeDevice(id=str(i), index=i) for i in range(count))
    return {PROTOCOL.annotations.node_devices: encode_inventory(devices)}


def placed_on(cluster: FakeCluster, node: str, *uids: str) -> None:
    """Schedules until the pods are on `node` (they come back once their 1 ms backoff ends)."""

    def placed() -> bool:
        cluster.schedule()
        return all(cluster.node_of(u) == node for u in uids)

    wait_for(placed, 5, f"pods {uids} placed on node {node}", interval_s=0.01)


def test_pod_whose_claim_is_missing_waits_and_says_why(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    uid = cluster.add_pod("claims", {"cpu": "1"}, resourceClaims=CLAIMS)
    cluster.schedule()
    assert cluster.node_of(uid) == ""
    (message,) = cluster.events(uid, "FailedScheduling")
    assert "ResourceClaim default/train-gpu not found" in message
    ((written, condition),) = cluster.scheduler.conditions.written
    assert written == uid
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert condition["message"] == message
    # a node brings no device of a claim (its slices do), so it does not bring the pod back
    cluster.add_node("b")
    assert cluster.schedule() == 0
    assert cluster.node_of(uid) == ""


def test_claim_pod_with_device_resources_is_refused_too(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    uid = cluster.add_pod("both", {GPU: "1"}, resourceClaims=CLAIMS)
    cluster.schedule()
    assert cluster.node_of(uid) == ""
    assert "ResourceClaim default/train-gpu" in cluster.events(uid, "FailedScheduling")[0]
    assert cluster.scheduler.cache.nodes["a"].devices.free_whole_count("gpu") == 8


def test_pod_without_claims_is_untouched(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    plain = cluster.add_pod("plain", {"cpu": "1"}, resourceClaims=[])
    cluster.schedule()
    assert cluster.node_of(plain) == "a"


def test_dra_node_with_stale_inventory_offers_no_device() -> None:
    cache = Cache(PROTOCOL)
    obj: dict[str, Any] = {
        "metadata": {"name": "n", "labels": DRA_LABEL, "annotations": stale_inventory()},
        "status": {"allocatable": {GPU: "8"}},
    }
    node = cache.update_node(obj)
    assert node.dra
    assert node.devices.devices == []
    assert node.inventory_error == ""
    assert cache.nodes_with_free("gpu", 1, ascending=True) == []
    assert cache.max_whole_capacity("gpu") == 0
    assert cache.nodes_with_slice_room(1, ascending=True) == []
    # switched back to the Device Plugin: the inventory counts again
    obj["metadata"]["labels"] = {}
    node = cache.update_node(obj)
    assert not node.dra
    assert len(node.devices.devices) == 8
    assert cache.nodes_with_free("gpu", 8, ascending=True) == ["n"]


def test_device_pod_never_lands_on_a_dra_node(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(NO_BACKOFF)
    cluster.add_node("dra", labels=DRA_LABEL, annotations=stale_inventory())
    whole = cluster.add_pod("whole", {GPU: "1"})
    piece = cluster.add_pod("slice", {CORE: "50", MEM: "50"})
    cpu = cluster.add_pod("cpu-only", {"cpu": "1"})
    cluster.schedule()
    assert cluster.node_of(whole) == cluster.node_of(piece) == ""
    assert cluster.node_of(cpu) == "dra"  # not a device pod: DRA nodes take it
    label = f"label {PROTOCOL.labels.device_api}=dra"
    (message,) = cluster.events(whole, "FailedScheduling")
    assert message == (
        "0/1 nodes are available: pod asks for 1 alibabacloud.com/gpu in all but the largest "
        f"node has 0 (1 node(s) serve devices through DRA, {label}: device pods there need "
        "ResourceClaims and the default scheduler)."
    )
    (message,) = cluster.events(piece, "FailedScheduling")
    assert message.startswith(
        f"0/1 nodes are available: 1 node(s) serve devices through DRA ({label})"
    ), message
    cluster.add_node("dp", annotations=stale_inventory())
    placed_on(cluster, "dp", whole, piece)


def test_node_leaving_dra_mode_brings_device_pods_back(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(NO_BACKOFF)
    cluster.add_node("n", labels=DRA_LABEL, annotations=stale_inventory())
    uid = cluster.add_pod("whole", {GPU: "2"})
    cluster.schedule()
    assert cluster.node_of(uid) == ""
    cluster.add_node("n", annotations=stale_inventory())  # the label removed

    placed_on(cluster, "n", uid)


def test_extender_leaves_claims_to_the_kube_scheduler_and_refuses_dra_nodes(
    cluster: FakeCluster,
) -> None:
    cluster.add_node("dp")
    cluster.add_node("dra", labels=DRA_LABEL, annotations=stale_inventory())
    ext = Extender(cluster.scheduler)
    uid = cluster.add_pod(
        "claims", {GPU: "1"}, scheduler_name="default-scheduler", resourceClaims=CLAIMS
    )
    answer = ext.filter({"Pod": cluster.pods[uid], "NodeNames": ["dp", "dra"]})
    assert answer["NodeNames"] == ["dp"]  # the kube-scheduler allocates the claims
    assert answer["FailedNodes"] == {"dra": f"Insufficient {GPU}"}  # the DRA node offers none


def test_claim_names_reads_the_spec() -> None:
    obj = {"metadata": {"name": "p", "uid": "u"}, "spec": {"resourceClaims": CLAIMS}}
    assert claim_names(parse_pod(obj)) == ["gpu"]
    assert claim_names(parse_pod({"metadata": {"name": "p"}, "spec": {}})) == []


@pytest.mark.parametrize("gpus", [2, 1])
def test_gang_plans_once_every_members_claims_are_made_and_wakes_them_all(
    make_cluster: MakeCluster, gpus: int
) -> None:
    """Two members, each claiming a GPU from a template: on 2 GPUs the gang is placed, on
    1 refused; either way both members hear it once the last claim is there."""
    cluster = make_cluster(NO_BACKOFF)
    cluster.add_node("a", labels=DRA_LABEL)
    for device_class in device_classes(PROTOCOL, extended_resources=False):
        cluster.scheduler.on_device_class("ADDED", device_class)
    devices = synthetic_gpus(gpus, pb.DEVICE_MODE_EXCLUSIVE)
    for obj in build_slices(devices, node_name="a", protocol=PROTOCOL, generation=1):
        cluster.scheduler.on_resource_slice("ADDED", obj)
    a = PROTOCOL.annotations
    gang = {a.gang_group: "g", a.gang_min_members: "2"}
    template = [{"name": "gpu", "resourceClaimTemplateName": "whole-gpu"}]
    first, second = (
        cluster.add_pod(name, {"cpu": "1"}, annotations=gang, resourceClaims=template)
        for name in ("m0", "m1")
    )

    def claim_made(uid: str) -> None:
        """The controller manager makes the member's claim; the scheduler sees the claim."""
        pod = cluster.pods[uid]
        name = f"{pod['metadata']['name']}-gpu"
        owner = {"kind": "Pod", "name": pod["metadata"]["name"], "uid": uid, "controller": True}
        meta = {"name": name, "namespace": "default", "uid": f"claim-{uid}"}
        request = exactly("gpu", PROTOCOL.dra.whole_class("gpu"))
        cluster.scheduler.on_resource_claim(
            "ADDED",
            {
                "metadata": {**meta, "resourceVersion": "1", "ownerReferences": [owner]},
                "spec": {"devices": {"requests": [request]}},
            },
        )

    def pod_names_claim(uid: str) -> None:
        """The controller manager names the member's claim in its status."""
        pod = cluster.pods[uid]
        made = [{"name": "gpu", "resourceClaimName": f"{pod['metadata']['name']}-gpu"}]
        pod["status"]["resourceClaimStatuses"] = made
        cluster.scheduler.on_pod("MODIFIED", copy.deepcopy(pod))

    def last_reason(uid: str) -> str:
        return cluster.events(uid, "FailedScheduling")[-1]

    own_wait = "waiting for the ResourceClaim of pod claim gpu to be made from its template"
    others_wait = "gang default/g: waiting for other members' ResourceClaims"
    cluster.schedule()
    for uid in (first, second):
        assert cluster.node_of(uid) == ""
        assert own_wait in last_reason(uid)
    claim_made(first)
    pod_names_claim(first)
    # m1's claim is seen before its pod names it: that event is the last, and both wait on
    claim_made(second)

    def both_wait_for_m1() -> bool:
        cluster.schedule()
        return others_wait in last_reason(first) and own_wait in last_reason(second)

    wait_for(both_wait_for_m1, 5, "both members waiting for m1's claim", interval_s=0.01)
    assert not any(cluster.events(uid, "GangPlanned") for uid in (first, second))
    # m1's pod update brings only m1 back; m1 wakes m0, and the gang is placed whole or
    # refused to both
    pod_names_claim(second)

    def settled() -> bool:
        cluster.schedule()
        if gpus == 2:  # both reserved: the gang is complete and binds
            return cluster.scheduler.queue.counts()["in_flight"] == 2
        return all("no room for the 2 still to place" in last_reason(u) for u in (first, second))

    wait_for(settled, 5, "the gang placed or refused to both members", interval_s=0.01)
    planned = [e for uid in (first, second) for e in cluster.events(uid, "GangPlanned")]
    assert len(planned) == (1 if gpus == 2 else 0)


def test_a_claim_event_brings_back_the_pods_it_may_help(make_cluster: MakeCluster) -> None:
    """As upstream's queueing hint: a claim made or changed brings back the pods that use
    it, not every pod turned away for devices; a claim whose devices are freed (its
    allocation gone, or the claim deleted) brings back every one of them."""
    cluster = make_cluster(NO_BACKOFF)
    cluster.add_node("a", labels=DRA_LABEL)
    scheduler = cluster.scheduler
    for device_class in device_classes(PROTOCOL, extended_resources=False):
        scheduler.on_device_class("ADDED", device_class)
    for obj in build_slices(
        synthetic_gpus(1, pb.DEVICE_MODE_EXCLUSIVE), node_name="a", protocol=PROTOCOL, generation=1
    ):
        scheduler.on_resource_slice("ADDED", obj)
    request = exactly("gpu", PROTOCOL.dra.whole_class("gpu"))

    def claim(name: str, version: int, allocation: Mapping[str, Any] | None = None) -> None:
        meta = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
        obj = {
            "metadata": {**meta, "resourceVersion": str(version)},
            "spec": {"devices": {"requests": [request]}},
            "status": {"allocation": allocation} if allocation else {},
        }
        scheduler.on_resource_claim("MODIFIED" if version > 1 else "ADDED", obj)

    # the only GPU is held by the claim "held"
    claim("held", 1)
    held = scheduler.cache.dra.claims["default/held"]
    planned, _ = allocate(scheduler.cache.dra, "a", [held])
    assert planned is not None
    (results,) = [item.results for item in planned]
    allocation = allocation_to_api("a", results, (), "2026-01-01T00:00:00Z")
    claim("held", 2, allocation)
    claim("mine", 1)
    uid = cluster.add_pod(
        "waiter", {"cpu": "1"}, resourceClaims=[{"name": "gpu", "resourceClaimName": "mine"}]
    )
    assert cluster.schedule() == 1
    assert "no node has a free device" in cluster.events(uid, "FailedScheduling")[-1]

    def moved_by(change: Callable[[], None]) -> bool:
        """Whether the claim event took the waiter out of the unschedulable pods."""
        change()
        moved = scheduler.queue.counts()["unschedulable"] == 0

        def turned_away_again() -> bool:
            cluster.schedule()
            return scheduler.queue.counts()["unschedulable"] == 1

        wait_for(turned_away_again, 5, "the waiter tried again and turned away", interval_s=0.01)
        return moved

    assert not moved_by(lambda: claim("another", 1))  # not the waiter's, frees nothing
    assert moved_by(lambda: claim("mine", 2))  # the waiter's own claim changed
    assert not moved_by(lambda: claim("held", 3, allocation))  # still holds the GPU
    claim("held", 4)  # its allocation went: the GPU is free
    assert scheduler.queue.counts()["unschedulable"] == 0
    wait_for(lambda: cluster.schedule() > 0, 5, "the waiter tried again", interval_s=0.01)
    assert scheduler.cache.pods[uid].node == "a"  # placed on the freed GPU
