"""Which pod is in admission (admission): the kubelet's pod list, the API server's, and the
kubelet's active pods over a real PodResources socket."""

from __future__ import annotations

import pytest

from lj_runtimekit.deviceplugin.internal.allocate.allocator import Allocator
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import NodePods, PodInfo
from lj_runtimekit.deviceplugin.internal.podresources.check import PodResourcesClient
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import GPU

from .conftest import KubeletPodResources, Parts, allocate_request, info


def rejected_and_next(parts: Parts) -> None:
    """Two waiting pods in the kubelet's list: `rejected` (refused by an admit handler before
    its device calls, still Pending there) and `next`, the one the kubelet admits."""
    parts.pod({"main": {GPU: 1}}, {"main": [DeviceShare(parts.gpu(2))]}, name="rejected")
    parts.pod({"main": {GPU: 1}}, {"main": [DeviceShare(parts.gpu(3))]}, name="next")


async def test_the_kubelets_active_pods_tell_the_pod_in_admission(
    parts: Parts, pod_resources: tuple[KubeletPodResources, PodResourcesClient]
) -> None:
    """A pod the kubelet rejected before its device calls is Pending in its pod list, and no
    API server answers: its PodResources lists only the pod it admits, which is served."""
    active, client = pod_resources
    rejected_and_next(parts)
    active.active(("default", "next"))
    allocator = parts.allocator(pod_resources=client)
    response = await allocator.allocate(GPU, allocate_request([parts.gpu(3)]))
    assert response.container_responses[0].envs["LJ_VISIBLE_DEVICES"] == parts.gpu(3)


async def test_several_waiting_pods_are_refused_with_what_the_plugin_saw(parts: Parts) -> None:
    """No PodResources: the refusal names the lists read and both possible causes."""
    rejected_and_next(parts)
    allocator = parts.allocator()
    with pytest.raises(AllocationError) as err:
        await allocator.allocate(GPU, allocate_request([parts.gpu(3)]))
    message = err.value.message
    assert "2 pods wait for devices (default/next, default/rejected) in the kubelet's pod" in (
        message
    )
    assert "the kubelet rejected one of them before its device calls" in message
    assert "or one was bound around the Runtime Kit scheduler" in message


class ApiServerPods(NodePods):
    """The node's pods as the API server watch has them (port 10255 closed): `items`, and
    `deleted`, the pods it saw deleted while Pending."""

    def __init__(self) -> None:
        super().__init__("", "node-1", None)
        self.items: list[PodInfo] = []
        self.deleted: list[PodInfo] = []

    @property
    def from_kubelet(self) -> bool:
        return False

    async def list_pods(self) -> list[PodInfo]:
        return list(self.items)

    async def fresh(self) -> list[PodInfo] | None:
        return list(self.items)

    def deleted_pending(self) -> list[PodInfo]:
        return list(self.deleted)

    def forget_deleted(self, uid: str) -> None:
        self.deleted = [p for p in self.deleted if p.uid != uid]


async def test_a_pod_recreated_under_a_deleted_pods_name_is_refused_one_call(
    parts: Parts, pod_resources: tuple[KubeletPodResources, PodResourcesClient]
) -> None:
    """The API server deleted a Pending pod the kubelet may still admit, and a pod of the same
    name (another UID) waits: PodResources names both alike, so one call is refused, naming
    both UIDs, and the next is served as the new pod's."""
    kubelet, client = pod_resources
    share = {"main": [DeviceShare(parts.gpu(3))]}
    old = info(parts.pod({"main": {GPU: 1}}, share, name="same", uid="uid-old", listed=False))
    new = info(parts.pod({"main": {GPU: 1}}, share, name="same", uid="uid-new", listed=False))
    pods = ApiServerPods()
    pods.items, pods.deleted = [new], [old]
    kubelet.active(("default", "same"))
    allocator = Allocator(
        parts.rm, parts.runtime, pods, parts.protocol, node_name="node-1", pod_resources=client
    )
    with pytest.raises(AllocationError) as err:
        await allocator.allocate(GPU, allocate_request([parts.gpu(3)]))
    assert "is admitting pod default/same (UID uid-new) or the pod of the same name" in (
        err.value.message
    )
    assert "(UID uid-old)" in err.value.message
    assert await parts.runtime.client.list_allocations() == []
    response = await allocator.allocate(GPU, allocate_request([parts.gpu(3)]))
    assert response.container_responses[0].annotations["lingjun.com/container-key"] == (
        "uid-new/main"
    )
