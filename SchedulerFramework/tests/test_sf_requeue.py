"""Requeue hints: a cluster event moves only the pods a plugin that cares about it rejected."""

from __future__ import annotations

import copy

from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.schedulerframework.internal.cache.podinfo import parse_pod
from lj_runtimekit.schedulerframework.internal.framework.types import ClusterEvent
from lj_runtimekit.schedulerframework.internal.queue.queue import SchedulingQueue
from lj_runtimekit.testkit.scheduler.fake import FakeCluster

GPU = load_protocol().resources.gpu


def parked(q: SchedulingQueue, name: str, rejected_by: frozenset[str]) -> None:
    q.add(parse_pod({"metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": {}}))
    qp = q.pop(0)
    assert qp is not None
    qp.rejected_by = rejected_by
    q.add_unschedulable(qp)


def test_event_moves_only_pods_whose_rejecting_plugins_registered_it() -> None:
    q = SchedulingQueue(initial_backoff_s=0.01)
    q.events_of = {
        "GpuShare": frozenset({ClusterEvent.POD_DELETE, ClusterEvent.NODE_ALLOCATABLE}),
        "NodeAffinity": frozenset({ClusterEvent.NODE_LABEL}),
    }
    parked(q, "devices", frozenset({"GpuShare"}))
    parked(q, "labels", frozenset({"NodeAffinity"}))
    parked(q, "both", frozenset({"GpuShare", "NodeAffinity"}))
    parked(q, "unknown", frozenset())
    parked(q, "gang", frozenset({"Coscheduling"}))  # registered nothing: every event
    assert q.move_for_event(ClusterEvent.NODE_TAINT) == 2  # unknown, gang
    assert q.move_for_event(ClusterEvent.NODE_LABEL) == 2  # labels, both
    assert q.counts()["unschedulable"] == 1
    assert q.move_for_event(ClusterEvent.POD_DELETE) == 1  # devices
    assert q.counts()["unschedulable"] == 0


def test_node_label_change_does_not_move_a_pod_short_of_devices(cluster: FakeCluster) -> None:
    cluster.add_node("n0", gpus=8)
    full = cluster.add_pod("full", {GPU: "8"})
    cluster.schedule()
    waiting = cluster.add_pod("waiting", {GPU: "1"})
    cluster.schedule()
    assert cluster.scheduler.queue.counts()["unschedulable"] == 1
    # a label and a taint that no rejecting plugin looks at: the pod stays parked
    node = copy.deepcopy(cluster.nodes["n0"])
    node["metadata"]["labels"]["team"] = "a"
    node["spec"]["taints"] = [{"key": "k", "value": "v", "effect": "PreferNoSchedule"}]
    cluster.scheduler.on_node("MODIFIED", node)
    assert cluster.scheduler.queue.counts()["unschedulable"] == 1
    # the pod holding the devices goes: it moves
    cluster.delete_pod(full)
    assert cluster.scheduler.queue.counts()["unschedulable"] == 0
    cluster.scheduler.queue.activate([waiting])
    cluster.schedule()
    assert cluster.node_of(waiting) == "n0"


def test_event_during_the_attempt_backs_off_only_pods_it_may_help() -> None:
    q = SchedulingQueue(initial_backoff_s=10)
    q.events_of = {"GpuShare": frozenset({ClusterEvent.POD_DELETE})}
    for name in ("a", "b"):
        q.add(parse_pod({"metadata": {"name": name, "namespace": "ns", "uid": name}}))
    a, b = q.pop(0), q.pop(0)
    assert a is not None
    assert b is not None
    q.move_for_event(ClusterEvent.NODE_LABEL)  # while both are being scheduled
    a.rejected_by = frozenset({"GpuShare"})
    q.add_unschedulable(a)
    assert q.counts()["unschedulable"] == 1  # a label does not help a pod short of devices
    q.move_for_event(ClusterEvent.POD_DELETE)
    b.rejected_by = frozenset({"GpuShare"})
    q.add_unschedulable(b)
    assert q.counts()["backoff"] == 2  # a, moved by the event; b, failed after it


def test_label_change_moves_a_pod_only_when_the_node_now_matches(cluster: FakeCluster) -> None:
    cluster.add_node("n0", gpus=8)
    cluster.add_node("n1", gpus=8, labels={"team": "a"})
    cluster.add_pod("full", {GPU: "8"}, nodeSelector={"team": "a"})
    cluster.schedule()
    waiting = cluster.add_pod("waiting", {GPU: "1"}, nodeSelector={"team": "a"})
    cluster.schedule()  # n0: NodeAffinity, n1: GpuShare
    queue = cluster.scheduler.queue

    def relabel(node: str, **labels: str) -> None:
        obj = copy.deepcopy(cluster.nodes[node])
        obj["metadata"]["labels"].update(labels)
        cluster.nodes[node] = obj
        cluster.scheduler.on_node("MODIFIED", copy.deepcopy(obj))

    relabel("n0", other="x")  # n0 still does not match
    relabel("n1", other="x")  # n1 matched already: its devices are the problem
    assert queue.counts()["unschedulable"] == 1
    relabel("n0", team="a")  # now n0 matches
    assert queue.counts()["unschedulable"] == 0
    queue.activate([waiting])
    cluster.schedule()
    assert cluster.node_of(waiting) == "n0"


def test_gated_pod_waits_outside_the_queue_until_its_gates_are_gone(
    cluster: FakeCluster,
) -> None:
    cluster.add_node("a")
    gates = [{"name": "kueue.x-k8s.io/admission"}]
    uid = cluster.add_pod("gated", {GPU: "1"}, schedulingGates=gates)
    assert cluster.schedule() == 0
    assert cluster.node_of(uid) == ""
    assert cluster.events(uid) == []  # never tried: no FailedScheduling, no condition
    assert set(cluster.scheduler.queue.counts().values()) == {0}
    assert cluster.scheduler.cache.nodes["a"].devices.free_whole_count("gpu") == 8
    cluster.update_pod_spec(uid, schedulingGates=None)  # admitted: the gate lifted
    cluster.schedule()
    assert cluster.node_of(uid) == "a"
