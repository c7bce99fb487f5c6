"""The binding cycle on the in-memory framework: failed binds and deleted pods."""

from __future__ import annotations

from collections.abc import Mapping

from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.types import Status
from lj_runtimekit.testkit.scheduler.fake import GPU, FakeCluster


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
