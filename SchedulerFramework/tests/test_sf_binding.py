"""The binding cycle on the in-memory framework: failed binds, binds without an answer,
deleted pods, stopping; the PodScheduled condition of pods that cannot be placed."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from lj_runtimekit.proto.pkg.kube import KubeError
from lj_runtimekit.proto.pkg.protocol import decode_assignment
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.types import Status, error
from lj_runtimekit.schedulerframework.internal.scheduler.conditions import (
    SCHEDULER_ERROR,
    UNSCHEDULABLE,
    scheduled_false,
)
from lj_runtimekit.schedulerframework.internal.scheduler.scheduler import Scheduler
from lj_runtimekit.testkit.scheduler.fake import GPU, FakeCluster
from lj_runtimekit.testkit.waits import wait_for


def test_a_pod_deleted_while_its_binding_fails_is_not_queued_again(cluster: FakeCluster) -> None:
    cluster.add_node("n0")
    uid = cluster.add_pod("gone", {GPU: "1"})
    cluster.fail_binds = 1
    bind = cluster.scheduler.bind_pod

    def bind_while_deleted(pod: PodInfo, node_name: str, annotations: Mapping[str, str]) -> Status:
        status = bind(pod, node_name, annotations)  # refused (a transient error) ...
        cluster.delete_pod(pod.uid)  # ... and the watch says DELETED before the answer arrives
        return status

    cluster.scheduler.bind_pod = bind_while_deleted  # type: ignore[method-assign]
    cluster.schedule()
    assert not cluster.scheduler.queue.has(uid)
    assert uid not in cluster.scheduler.cache.pods
    assert cluster.scheduler.cache.free_whole("gpu", "n0") == 8


def test_a_pod_being_deleted_leaves_the_queue(cluster: FakeCluster) -> None:
    waiting = cluster.add_pod("waiting", {GPU: "1"})
    cluster.schedule()  # no node yet: unschedulable
    assert cluster.scheduler.queue.has(waiting)
    cluster.terminate_pod(waiting)
    assert not cluster.scheduler.queue.has(waiting)
    # a Binding refused because the pod is being deleted drops the pod: the watch has not
    # said so yet, and the pod never comes back
    cluster.add_node("n0")
    uid = cluster.add_pod("terminating", {GPU: "1"})
    bind = cluster.scheduler.bind_pod

    def bind_while_terminating(
        pod: PodInfo, node_name: str, annotations: Mapping[str, str]
    ) -> Status:
        cluster.pods[pod.uid]["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        return bind(pod, node_name, annotations)

    cluster.scheduler.bind_pod = bind_while_terminating  # type: ignore[method-assign]
    cluster.schedule()
    assert not cluster.scheduler.queue.has(uid)
    assert cluster.scheduler.cache.free_whole("gpu", "n0") == 8


class NoAnswer:
    """An API server whose answer to a Binding never arrives: it writes the Binding
    (`commit`) or not, and the watch shows nothing until the test delivers it."""

    def __init__(self, cluster: FakeCluster, commit: bool) -> None:
        self.cluster = cluster
        self.commit = commit

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        obj = self.cluster.pods[body["metadata"]["uid"]]
        if self.commit:
            obj["spec"]["nodeName"] = body["target"]["name"]
            obj["metadata"]["annotations"].update(body["metadata"]["annotations"])
        raise KubeError(f"{method} {path}", 0, "Read timed out. (read timeout=30)")


def lose_first_answer(cluster: FakeCluster, commit: bool) -> None:
    """The first Binding goes through the scheduler's API client and gets no answer; the
    others are answered by the in-memory API server."""
    answered = cluster.scheduler.bind_pod
    first = True

    def bind(pod: PodInfo, node_name: str, annotations: Mapping[str, str]) -> Status:
        nonlocal first
        if not first:
            return answered(pod, node_name, annotations)
        first = False
        cluster.scheduler.kube = NoAnswer(cluster, commit)  # type: ignore[assignment]
        return Scheduler.bind_pod(cluster.scheduler, pod, node_name, annotations)

    cluster.scheduler.bind_pod = bind  # type: ignore[method-assign]


def test_a_binding_without_an_answer_holds_its_devices_until_the_watch_shows_it(
    cluster: FakeCluster,
) -> None:
    cluster.add_node("n0")
    lose_first_answer(cluster, commit=True)
    first = cluster.add_pod("first", {GPU: "8"})
    cluster.schedule()
    second = cluster.add_pod("second", {GPU: "8"})
    cluster.schedule()
    assert cluster.node_of(second) == ""  # the first one's GPUs are still held
    cluster.scheduler.on_pod("MODIFIED", copy.deepcopy(cluster.pods[first]))  # the watch, late
    cluster.admit_pod(first)
    assert not cluster.scheduler.cache.is_assumed(first)  # confirmed
    assert not cluster.scheduler.queue.has(first)
    assert cluster.node_of(second) == ""
    assert cluster.scheduler.cache.violations() == []


def test_a_binding_without_an_answer_is_tried_again_when_the_pod_never_shows_bound(
    make_cluster: Callable[[Mapping[str, Any] | None], FakeCluster],
) -> None:
    cluster = make_cluster({"podInitialBackoffSeconds": 0.001, "podMaxBackoffSeconds": 0.001})
    cluster.scheduler.assumed_expiry_s = 0.3
    cluster.add_node("n0")
    lose_first_answer(cluster, commit=False)
    first = cluster.add_pod("first", {GPU: "8"})
    cluster.schedule()
    second = cluster.add_pod("second", {GPU: "8"})
    cluster.schedule()
    assert cluster.node_of(second) == ""
    assert cluster.scheduler.cache.is_assumed(first)
    wait_for(
        lambda: not cluster.scheduler.cache.is_assumed(first),
        10,
        "the assumption expired",
        interval_s=0.02,
    )
    assert any("did not show bound within 0.3s" in e for e in cluster.events(first))
    time.sleep(0.01)
    cluster.schedule()
    assert cluster.node_of(first) == "n0"
    assert cluster.node_of(second) == ""


def test_stopping_drops_the_queued_binds_and_waits_only_for_the_one_sent(
    make_cluster: Callable[[Mapping[str, Any] | None], FakeCluster],
) -> None:
    cluster = make_cluster({"bindWorkers": 1})
    cluster.add_node("n0")
    answered = cluster.scheduler.bind_pod
    release = threading.Event()
    sent: list[str] = []

    def slow(pod: PodInfo, node_name: str, annotations: Mapping[str, str]) -> Status:
        sent.append(pod.name)
        release.wait(10)
        return answered(pod, node_name, annotations)

    cluster.scheduler.bind_pod = slow  # type: ignore[method-assign]
    uids = [cluster.add_pod(f"p{i}", {"cpu": "1"}) for i in range(4)]
    cluster.schedule(wait_binds=False)  # one bind sent, three queued behind it
    wait_for(lambda: sent, 5, "the first bind sent", interval_s=0.01)
    stopper = threading.Thread(target=cluster.scheduler.stop)
    stopper.start()
    time.sleep(0.2)
    release.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert sent == ["p0"]
    assert [cluster.node_of(u) for u in uids] == ["n0", "", "", ""]


def test_pod_scheduled_false_written_as_kube_scheduler_writes_it(
    make_cluster: Callable[[Mapping[str, Any] | None], FakeCluster],
) -> None:
    pending = {"status": {"phase": "Pending"}}
    first = scheduled_false(pending, UNSCHEDULABLE, "0/1 nodes are available: x.", "t1")
    assert first == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: x.",
        "lastProbeTime": None,
        "lastTransitionTime": "t1",
    }
    shown = {"status": {"conditions": [first]}}
    assert scheduled_false(shown, UNSCHEDULABLE, "0/1 nodes are available: x.", "t2") is None
    changed = scheduled_false(shown, SCHEDULER_ERROR, "Binding rejected: y", "t2")
    assert changed is not None
    assert changed["lastTransitionTime"] == "t1"  # still False: the transition time stays
    # the scheduler writes it for a pod that cannot be placed, and for a failed bind
    cluster = make_cluster({"podInitialBackoffSeconds": 0.001, "podMaxBackoffSeconds": 0.001})
    uid = cluster.add_pod("nowhere", {GPU: "1"})
    cluster.schedule()
    ((written_uid, condition),) = cluster.scheduler.conditions.written
    assert written_uid == uid
    assert (condition["reason"], condition["message"]) == (
        "Unschedulable",
        f"0/0 nodes are available: pod asks for 1 {GPU} in all but the largest node has 0.",
    )
    cluster.fail_binds = 1
    cluster.add_node("n0")
    time.sleep(0.01)
    cluster.schedule()
    assert cluster.scheduler.conditions.written[-1][1]["reason"] == "SchedulerError"
    assert (
        "Binding rejected: injected bind failure"
        in cluster.scheduler.conditions.written[-1][1]["message"]
    )


def test_a_refused_binding_keeps_what_the_watch_confirmed_meanwhile(cluster: FakeCluster) -> None:
    # The Binding is refused as already assigned, and the watch has shown the pod bound (by
    # an earlier Binding of it) before the answer: the devices it holds stay held.
    cluster.add_node("n0")
    bind = cluster.scheduler.bind_pod

    def landed_before(pod: PodInfo, node_name: str, annotations: Mapping[str, str]) -> Status:
        bind(pod, node_name, annotations)
        return error(f"pod {pod.key} is already assigned to node {node_name}")

    cluster.scheduler.bind_pod = landed_before  # type: ignore[method-assign]
    first = cluster.add_pod("first", {GPU: "4"})
    cluster.schedule()
    cluster.scheduler.bind_pod = bind  # type: ignore[method-assign]
    assert cluster.scheduler.cache.free_whole("gpu", "n0") == 4
    second = cluster.add_pod("second", {GPU: "4"})
    cluster.schedule()
    assert cluster.node_of(second) == "n0"
    held = [set(decode_assignment(cluster.assignment(u))["c0"]) for u in (first, second)]
    assert not held[0] & held[1]
    assert cluster.scheduler.cache.violations() == []
