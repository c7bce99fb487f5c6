"""Extender verbs on the in-memory API server double: what bind refuses, what it holds."""

from __future__ import annotations

import copy
from collections.abc import Mapping

from lj_runtimekit.proto.pkg.protocol import decode_assignment
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.extender.server import Extender
from lj_runtimekit.schedulerframework.internal.framework.types import Code, Status
from lj_runtimekit.testkit.scheduler.fake import GPU, PROTOCOL, FakeCluster
from lj_runtimekit.testkit.waits import wait_for


def bind(ext: Extender, cluster: FakeCluster, uid: str, node: str) -> str:
    """Filter (the extender remembers the pod), then bind to `node`; the answer's Error."""
    pod = copy.deepcopy(cluster.pods[uid])
    ext.filter({"Pod": pod, "NodeNames": sorted(cluster.nodes)})
    meta = pod["metadata"]
    answer = ext.bind(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": uid, "Node": node}
    )
    return str(answer["Error"])


def devices(cluster: FakeCluster, uid: str) -> set[str]:
    """The device IDs the pod's assignment names."""
    return {s.device_id for c in decode_assignment(cluster.assignment(uid)).values() for s in c}


def test_bind_refuses_a_node_the_pods_filter_rejects(cluster: FakeCluster) -> None:
    cluster.add_node("tainted", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    cluster.add_node("other-zone", labels={"zone": "b"})
    cluster.add_node("full", gpus=1)
    ext = Extender(cluster.scheduler)
    taint = cluster.add_pod("taint", {GPU: "1"})
    selector = cluster.add_pod("selector", {GPU: "1"}, nodeSelector={"zone": "a"})
    big = cluster.add_pod("big", {GPU: "2"})
    assert "untolerated taint {k: v}" in bind(ext, cluster, taint, "tainted")
    assert "didn't match Pod's node affinity/selector" in bind(ext, cluster, selector, "other-zone")
    assert f"Insufficient {GPU}" in bind(ext, cluster, big, "full")
    for uid in (taint, selector, big):
        assert cluster.node_of(uid) == ""
        assert uid not in cluster.scheduler.cache.pods
        assert any("cannot be bound to node" in e for e in cluster.events(uid, "FailedScheduling"))
    assert bind(ext, cluster, big, "other-zone") == ""
    assert cluster.node_of(big) == "other-zone"


def test_gang_members_are_refused_not_bound_one_at_a_time(cluster: FakeCluster) -> None:
    cluster.add_node("n0")
    ext = Extender(cluster.scheduler)
    a = PROTOCOL.annotations
    uid = cluster.add_pod(
        "member-0", {GPU: "1"}, annotations={a.gang_group: "train", a.gang_min_members: "2"}
    )
    answer = ext.filter({"Pod": cluster.pods[uid], "NodeNames": ["n0"]})
    refusal = "gangs need lj-scheduler profile, extender mode cannot place all-or-nothing"
    assert answer["NodeNames"] == []
    assert refusal in answer["FailedAndUnresolvableNodes"]["n0"]
    error = bind(ext, cluster, uid, "n0")
    assert refusal in error
    assert "default/train" in error
    assert cluster.node_of(uid) == ""
    assert any(refusal in e for e in cluster.events(uid, "FailedScheduling"))


def test_a_binding_without_an_answer_keeps_its_devices_until_it_expires(
    cluster: FakeCluster,
) -> None:
    cluster.add_node("n0")
    cluster.scheduler.assumed_expiry_s = 0.5
    ext = Extender(cluster.scheduler)
    answered = cluster.scheduler.bind_pod

    def no_answer(pod: PodInfo, node: str, annotations: Mapping[str, str]) -> Status:
        return Status(Code.ERROR, ("read timed out",), "DefaultBinder", True)

    cluster.scheduler.bind_pod = no_answer  # type: ignore[method-assign,assignment]
    first = cluster.add_pod("first", {GPU: "8"})
    second = cluster.add_pod("second", {GPU: "8"})
    assert "got no answer (read timed out)" in bind(ext, cluster, first, "n0")
    assert cluster.scheduler.cache.is_assumed(first)  # the 8 GPUs stay held
    cluster.scheduler.bind_pod = answered  # type: ignore[method-assign]
    assert f"Insufficient {GPU}" in bind(ext, cluster, second, "n0")
    assert "got no answer yet" in bind(ext, cluster, first, "n0")
    wait_for(
        lambda: not cluster.scheduler.cache.is_assumed(first),
        10,
        "the assumption expired",
        interval_s=0.02,
    )
    assert bind(ext, cluster, second, "n0") == ""
    assert cluster.scheduler.cache.violations() == []


def test_a_second_bind_for_a_bound_pod_is_refused_and_its_devices_stay_held(
    cluster: FakeCluster,
) -> None:
    # A Binding that landed after the caller's timeout is retried: the pod is bound already.
    cluster.add_node("n0")
    ext = Extender(cluster.scheduler)
    first = cluster.add_pod("first", {GPU: "4"})
    pending = copy.deepcopy(cluster.pods[first])
    assert bind(ext, cluster, first, "n0") == ""
    held = cluster.assignment(first)
    ext.filter({"Pod": pending, "NodeNames": ["n0"]})  # the caller's copy is stale
    meta = pending["metadata"]
    answer = ext.bind(
        {"PodName": meta["name"], "PodNamespace": "default", "PodUID": first, "Node": "n0"}
    )
    assert str(answer["Error"]) == "pod default/first is bound to node n0 already"
    assert "already" in bind(ext, cluster, first, "n0")  # nodeName set in the caller's copy
    state = cluster.scheduler.cache.pods[first]
    assert (state.node, state.assumed, state.devices_text) == ("n0", False, held)
    second = cluster.add_pod("second", {GPU: "8"})
    assert f"Insufficient {GPU}" in bind(ext, cluster, second, "n0")
    third = cluster.add_pod("third", {GPU: "4"})
    assert bind(ext, cluster, third, "n0") == ""
    assert not devices(cluster, first) & devices(cluster, third)
    assert cluster.scheduler.cache.violations() == []


def test_a_refused_binding_keeps_what_the_watch_confirmed_meanwhile(cluster: FakeCluster) -> None:
    # Two binds of one pod race: the other one's Binding lands (the watch confirms the pod)
    # while this one's is refused as already assigned. The confirmed devices stay held.
    cluster.add_node("n0")
    ext = Extender(cluster.scheduler)
    answered = cluster.scheduler.bind_pod

    def landed_elsewhere(pod: PodInfo, node: str, annotations: Mapping[str, str]) -> Status:
        answered(pod, node, annotations)
        return Status(Code.ERROR, (f"pod {pod.key} is already assigned to node {node}",))

    cluster.scheduler.bind_pod = landed_elsewhere  # type: ignore[method-assign,assignment]
    first = cluster.add_pod("first", {GPU: "4"})
    assert "already assigned" in bind(ext, cluster, first, "n0")
    cluster.scheduler.bind_pod = answered  # type: ignore[method-assign]
    state = cluster.scheduler.cache.pods[first]
    assert (state.node, state.assumed) == ("n0", False)
    second = cluster.add_pod("second", {GPU: "4"})
    assert bind(ext, cluster, second, "n0") == ""
    assert not devices(cluster, first) & devices(cluster, second)
    assert cluster.scheduler.cache.violations() == []
