"""Which pod is in admission (admission): the kubelet's pod list, the API server's, and the
kubelet's active pods over a real PodResources socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podresources.check import PodResourcesClient
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2_grpc as prgrpc
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import GPU

from .conftest import Parts


class ActivePods(prgrpc.PodResourcesListerServicer):
    """The kubelet's PodResources `List`: the pods it holds active (no devices needed)."""

    def __init__(self) -> None:
        self.pods: list[tuple[str, str]] = []

    async def List(self, request: Any, context: Any) -> prpb.ListPodResourcesResponse:
        return prpb.ListPodResourcesResponse(
            pod_resources=[prpb.PodResources(namespace=ns, name=n) for ns, n in self.pods]
        )


@pytest.fixture
async def pod_resources(workdir: Path) -> AsyncIterator[tuple[ActivePods, PodResourcesClient]]:
    servicer = ActivePods()
    server = grpc.aio.server()
    prgrpc.add_PodResourcesListerServicer_to_server(servicer, server)
    path = workdir / "pod-resources.sock"
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    yield servicer, PodResourcesClient(str(path))
    await server.stop(None)


def gpu_call(ids: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )


def rejected_and_next(parts: Parts) -> None:
    """Two waiting pods in the kubelet's list: `rejected` (refused by an admit handler before
    its device calls, still Pending there) and `next`, the one the kubelet admits."""
    parts.pod({"main": {GPU: 1}}, {"main": [DeviceShare(parts.gpu(2))]}, name="rejected")
    parts.pod({"main": {GPU: 1}}, {"main": [DeviceShare(parts.gpu(3))]}, name="next")


async def test_the_kubelets_active_pods_tell_the_pod_in_admission(
    parts: Parts, pod_resources: tuple[ActivePods, PodResourcesClient]
) -> None:
    """A pod the kubelet rejected before its device calls is Pending in its pod list, and no
    API server answers: its PodResources lists only the pod it admits, which is served."""
    active, client = pod_resources
    rejected_and_next(parts)
    active.pods = [("default", "next")]
    allocator = parts.allocator(pod_resources=client)
    response = await allocator.allocate(GPU, gpu_call([parts.gpu(3)]))
    assert response.container_responses[0].envs["LJ_VISIBLE_DEVICES"] == parts.gpu(3)


async def test_several_waiting_pods_are_refused_with_what_the_plugin_saw(parts: Parts) -> None:
    """No PodResources: the refusal names the lists read and both possible causes."""
    rejected_and_next(parts)
    allocator = parts.allocator()
    with pytest.raises(AllocationError) as err:
        await allocator.allocate(GPU, gpu_call([parts.gpu(3)]))
    message = err.value.message
    assert "2 pods wait for devices (default/next, default/rejected) in the kubelet's pod" in (
        message
    )
    assert "the kubelet rejected one of them before its device calls" in message
    assert "or one was bound around the Runtime Kit scheduler" in message
