"""Fixtures: a short socket directory, a node bed factory, and the allocator's parts (the
Runtime simulator in process on a real socket, a kubelet `/pods` server) for unit tests."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.allocate.allocator import Allocator
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import NodePods, PodInfo, parse_pod
from lj_runtimekit.deviceplugin.internal.podresources.check import PodResourcesClient
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager, RuntimeAccess
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2_grpc as prgrpc
from lj_runtimekit.proto.pkg.featuregate import evaluate
from lj_runtimekit.proto.pkg.protocol import DeviceShare, Protocol, encode_assignment
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy
from lj_runtimekit.proto.pkg.version import Version
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET, Simulator
from lj_runtimekit.testkit.kubelet.bed import (
    ANN,
    CORE,
    GPU,
    MEMORY,
    PROTOCOL,
    Bed,
    BedError,
    node_bed,
)
from lj_runtimekit.testkit.podserver import PodListServer, pod_object

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory for unix sockets (paths stay under ~100 characters)."""
    path = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_bed(workdir: Path) -> BedFactory:
    """Start a bed for an example node; the plugin is registered and listed when it yields."""

    @contextlib.asynccontextmanager
    async def factory(
        node: str = "tdm-8gpu",
        *,
        version: str | None = None,
        plugin_args: Sequence[str] = (),
        wait_for: Sequence[str] = (GPU, CORE, MEMORY),
    ) -> AsyncIterator[Bed]:
        try:
            async with node_bed(
                workdir, node, version=version, plugin_args=plugin_args, wait_for=wait_for
            ) as bed:
                yield bed
                assert bed.plugin.running, bed.fail("plugin exited during the test")
        except BedError as exc:
            pytest.fail(str(exc))

    return factory


@dataclass
class Parts:
    """The allocator's real collaborators: the Runtime simulator (in process, on a unix
    socket), its client, the resource manager, and the kubelet's `/pods` (over HTTP)."""

    sim: Simulator
    runtime: RuntimeAccess
    rm: ResourceManager
    kubelet_pods: PodListServer
    node_pods: NodePods
    protocol: Protocol = PROTOCOL
    _n: int = field(default=0)

    def gpu(self, index: int) -> str:
        """The ID of the node's GPU `index`."""
        return self.rm.snapshot.devices[index].id

    def pod(
        self,
        containers: Mapping[str, Mapping[str, int]],
        assignment: Mapping[str, Sequence[DeviceShare]] | None = None,
        *,
        name: str | None = None,
        listed: bool = True,
        **kw: Any,
    ) -> dict[str, Any]:
        """A pending pod placed with `assignment`, in the kubelet's `/pods` when `listed`."""
        self._n += 1
        annotations = dict(kw.pop("annotations", {}))
        if assignment is not None:
            annotations[ANN.assigned_devices] = encode_assignment(
                {c: tuple(s) for c, s in assignment.items()}
            )
        pod = pod_object(
            name or f"pod-{self._n}",
            containers,
            uid=kw.pop("uid", f"uid-{self._n:04d}"),
            node_name="node-1",
            annotations=annotations,
            **kw,
        )
        if listed:
            self.kubelet_pods.put(pod)
        return pod

    def allocator(self, **kw: Any) -> Allocator:
        """An allocator over these parts (no recorder unless given)."""
        return Allocator(
            self.rm, self.runtime, self.node_pods, self.protocol, node_name="node-1", **kw
        )


class KubeletPodResources(prgrpc.PodResourcesListerServicer):
    """The kubelet's PodResources `List`, answering `listed` (set by the test)."""

    def __init__(self) -> None:
        self.listed = prpb.ListPodResourcesResponse()

    def active(self, *refs: tuple[str, str]) -> None:
        """List these (namespace, name) pods, without devices."""
        self.listed = prpb.ListPodResourcesResponse(
            pod_resources=[prpb.PodResources(namespace=ns, name=n) for ns, n in refs]
        )

    async def List(self, request: Any, context: Any) -> prpb.ListPodResourcesResponse:
        return self.listed

    async def Get(self, request: Any, context: Any) -> prpb.GetPodResourcesResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not used by the plugin")
        return prpb.GetPodResourcesResponse()

    async def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> prpb.AllocatableResourcesResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not used by the plugin")
        return prpb.AllocatableResourcesResponse()


@pytest.fixture
async def pod_resources(
    workdir: Path,
) -> AsyncIterator[tuple[KubeletPodResources, PodResourcesClient]]:
    """A PodResources server on a unix socket, and the plugin's client of it."""
    servicer = KubeletPodResources()
    server = grpc.aio.server()
    prgrpc.add_PodResourcesListerServicer_to_server(servicer, server)
    path = workdir / "pod-resources.sock"
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    yield servicer, PodResourcesClient(str(path))
    await server.stop(None)


def allocate_request(ids: Sequence[str]) -> api_pb2.AllocateRequest:
    """A kubelet Allocate call for one container."""
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
    )


def info(pod: Mapping[str, Any]) -> PodInfo:
    """The plugin's view of a pod object."""
    return parse_pod(pod)


@pytest.fixture
async def parts(workdir: Path) -> AsyncIterator[Parts]:
    """The allocator's parts on an example TDM node with 8 GPUs."""
    sim = Simulator(load_node_file(EXAMPLE_NODES / "tdm-8gpu.yaml"), workdir / "sim")
    await sim.start()
    runtime = RuntimeAccess(str(workdir / "sim"), RUNTIME_SOCKET, RetryPolicy(attempts=1))
    try:
        devices = tuple(await runtime.client.list_devices())
        gates = evaluate(sim.state.version, Version(1, 15, 0))
        rm = ResourceManager(runtime, PROTOCOL, gates, devices)
        with PodListServer() as server:
            node_pods = NodePods(server.url, "node-1", None)
            try:
                yield Parts(sim, runtime, rm, server, node_pods)
            finally:
                await node_pods.aclose()
    finally:
        await runtime.close()
        await sim.stop(0)
