"""One device pod in admission per node (FakeCluster plays the API server and the node)."""

from __future__ import annotations

import copy

from lj_runtimekit.proto.pkg.protocol import (
    ADMISSION_KUBELET_ORDER,
    BIND_PHASE_ALLOCATED,
    BIND_PHASE_ALLOCATING,
    decode_assignment,
    encode_assignment,
)
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID
from lj_runtimekit.testkit.scheduler.fake import (
    CORE,
    GPU,
    MEM,
    PROTOCOL,
    FakeCluster,
)
from lj_runtimekit.testkit.waits import wait_for


def test_a_node_takes_the_next_device_pod_only_after_the_previous_is_admitted(
    cluster: FakeCluster,
) -> None:
    cluster.admit = False
    cluster.add_node("only")
    first = cluster.add_pod("first", {GPU: "1"})
    second = cluster.add_pod("second", {GPU: "1"})
    cpu = cluster.add_pod("cpu", {"cpu": "1"})
    cluster.schedule(wait_binds=False)
    wait_for(
        lambda: cluster.node_of(first) == "only" and cluster.node_of(cpu) == "only",
        5,
        "the first device pod and the CPU pod bound",
        interval_s=0.01,
    )
    ann = cluster.pods[first]["metadata"]["annotations"]
    assert ann[PROTOCOL.annotations.bind_phase] == BIND_PHASE_ALLOCATING
    assert ann[ASSIGNED_POD_UID] == first  # the assignment names the pod it was made for
    # The second device pod is placed (its devices reserved) but not bound yet.
    assert cluster.assignment(second) == ""
    assert cluster.scheduler.admission.queued() == 1
    assert cluster.scheduler.admission.holders("only") == {first}
    cluster.admit_pod(first)
    wait_for(lambda: cluster.node_of(second) == "only", 5, "the second pod bound", interval_s=0.01)
    assert cluster.scheduler.admission.holders("only") == {second}
    # A rejection (Failed) settles the admission too; so does a deletion.
    cluster.admit_pod(second, phase="Failed")
    assert cluster.scheduler.admission.holders("only") == set()
    third = cluster.add_pod("third", {GPU: "1"})
    cluster.schedule(wait_binds=False)
    wait_for(lambda: cluster.node_of(third) == "only", 5, "the third pod bound", interval_s=0.01)
    cluster.delete_pod(third)
    assert cluster.scheduler.admission.holders("only") == set()


def test_pods_in_admission_are_rebuilt_after_a_restart(cluster: FakeCluster) -> None:
    cluster.admit = False
    cluster.add_node("only")
    first = cluster.add_pod("first", {GPU: "1"})
    cluster.schedule(wait_binds=False)
    wait_for(lambda: cluster.node_of(first) == "only", 5, "the first pod bound", interval_s=0.01)
    cluster.restart()
    assert cluster.scheduler.admission.holders("only") == {first}
    second = cluster.add_pod("second", {GPU: "1"})
    cluster.schedule(wait_binds=False)
    assert cluster.node_of(second) == ""
    cluster.admit_pod(first)
    wait_for(lambda: cluster.node_of(second) == "only", 5, "the second pod bound", interval_s=0.01)


def test_binpack_is_kept_and_bindings_queue_per_node(cluster: FakeCluster) -> None:
    """Admission does not change placement: binpack stacks both pods on one node, the
    second binding waits for the first pod's admission, then binds."""
    cluster.admit = False
    cluster.add_node("a")
    cluster.add_node("b")
    first = cluster.add_pod("first", {GPU: "1"})
    second = cluster.add_pod("second", {GPU: "1"})
    cluster.schedule(wait_binds=False)
    wait_for(lambda: cluster.node_of(first), 5, "the first pod bound", interval_s=0.01)
    assert cluster.node_of(second) == ""
    assert cluster.scheduler.admission.queued() == 1
    cluster.admit_pod(first)
    wait_for(
        lambda: cluster.node_of(second) == cluster.node_of(first),
        5,
        "the second pod bound beside the first",
        interval_s=0.01,
    )


def test_a_node_whose_plugin_reads_the_kubelets_pods_takes_device_pods_at_once(
    cluster: FakeCluster,
) -> None:
    """A Device Plugin reading the kubelet's own pod list sees a pod only as the kubelet
    starts admitting it, one at a time: its node (`kubelet-order`) is not held."""
    cluster.admit = False
    mode = {PROTOCOL.annotations.node_admission: ADMISSION_KUBELET_ORDER}
    cluster.add_node("fast", annotations=mode)
    first = cluster.add_pod("first", {GPU: "1"})
    second = cluster.add_pod("second", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(first) == cluster.node_of(second) == "fast"
    assert cluster.scheduler.admission.queued() == 0


def test_a_partial_record_keeps_the_other_containers_assigned_devices(
    cluster: FakeCluster,
) -> None:
    """The Device Plugin records each container as it is allocated: while the pod's
    admission is unsettled (or after it was refused at its second container), the
    containers not recorded yet keep their assigned devices."""
    a = PROTOCOL.annotations
    slice_60 = {CORE: "60", MEM: "60"}
    cluster.add_node("only", gpus=2, annotations={a.node_admission: ADMISSION_KUBELET_ORDER})
    cluster.admit = False
    pair = cluster.add_pod("pair", [slice_60, slice_60])
    cluster.schedule()
    assigned = decode_assignment(cluster.assignment(pair))
    assert {s.device_id for shares in assigned.values() for s in shares} == {"0", "1"}
    obj = cluster.pods[pair]
    obj["metadata"]["annotations"][a.allocated_devices] = encode_assignment({"c0": assigned["c0"]})
    cluster.scheduler.on_pod("MODIFIED", copy.deepcopy(obj))
    # 180 % of 200 % fits the node's counts, but no device has 60 % left.
    late = cluster.add_pod("late", slice_60)
    cluster.schedule()
    assert cluster.node_of(late) == ""
    assert cluster.scheduler.cache.violations() == []
    # Once settled, the record is what the pod holds (here: c1 got no device), and the
    # device it frees is offered to the waiting pod.
    obj["metadata"]["annotations"][a.bind_phase] = BIND_PHASE_ALLOCATED
    cluster.scheduler.on_pod("MODIFIED", copy.deepcopy(obj))

    def late_bound() -> bool:
        cluster.schedule()
        return cluster.node_of(late) == "only"

    wait_for(late_bound, 5, "the late pod bound", interval_s=0.01)
