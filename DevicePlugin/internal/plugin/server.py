"""One DevicePlugin gRPC server per resource, on its own socket in the kubelet plugin dir.

Lifecycle of an endpoint: serve the socket, dial it to confirm it answers,
then Register with the kubelet; stop removes the socket.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import grpc

from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager
from lj_runtimekit.deviceplugin.internal.rm.resources import KubeletDevice
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_MAX_SOCKET_PATH = 107

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class AllocationError(Exception):
    """A kubelet request that cannot be served; `code` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Allocations(Protocol):
    """What the servers delegate GetPreferredAllocation and Allocate to."""

    async def preferred(
        self, resource: str, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """Preferred device IDs per container."""

    async def allocate(
        self, resource: str, request: api_pb2.AllocateRequest
    ) -> api_pb2.AllocateResponse:
        """What the container runtime injects, per container."""


class EndpointError(Exception):
    """An endpoint cannot serve or register; the message names the socket."""


def socket_name(resource: str) -> str:
    """Socket file name of a resource, e.g. `lj-alibabacloud.com_gpu.sock`."""
    return "lj-" + re.sub(r"[^A-Za-z0-9_.-]", "_", resource) + ".sock"


def list_response(devices: tuple[KubeletDevice, ...]) -> api_pb2.ListAndWatchResponse:
    """The ListAndWatch message of a device list."""
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=d.id,
                health=HEALTHY if d.healthy else UNHEALTHY,
                topology=(
                    api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa_node)])
                    if d.numa_node >= 0
                    else None
                ),
            )
            for d in devices
        ]
    )


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    """The kubelet device plugin API for one resource."""

    def __init__(
        self, resource: str, rm: ResourceManager, allocations: Allocations, stop: asyncio.Event
    ) -> None:
        self.resource = resource
        self._rm = rm
        self._allocations = allocations
        self._stop = stop

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        """No PreStartContainer; GetPreferredAllocation is served."""
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        """The full list at once, then again on every change of this resource's devices."""
        snap = self._rm.snapshot
        sent = snap.inventory.resources.get(self.resource, ())
        log.info("list and watch opened", extra={"resource": self.resource, "devices": len(sent)})
        yield list_response(sent)
        stop = asyncio.create_task(self._stop.wait())
        try:
            while True:
                change = asyncio.create_task(self._rm.wait_changed(snap.generation))
                done, _ = await asyncio.wait({change, stop}, return_when=asyncio.FIRST_COMPLETED)
                if stop in done:
                    change.cancel()
                    return
                snap = change.result()
                devices = snap.inventory.resources.get(self.resource, ())
                if devices != sent:
                    sent = devices
                    healthy = sum(1 for d in devices if d.healthy)
                    log.info(
                        "list and watch update",
                        extra={
                            "resource": self.resource,
                            "devices": len(devices),
                            "healthy": healthy,
                        },
                    )
                    yield list_response(devices)
        finally:
            stop.cancel()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        """The scheduler's choice when known, else the best-connected devices."""
        try:
            return await self._allocations.preferred(self.resource, request)
        except AllocationError as exc:
            log.warning(
                "preferred allocation refused", extra={"resource": self.resource, "reason": exc}
            )
            await context.abort(exc.code, exc.message)
            raise AssertionError("context.abort returned") from exc

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Context
    ) -> api_pb2.AllocateResponse:
        """Find the pod by identity, ask the Runtime, and answer the injection spec."""
        try:
            return await self._allocations.allocate(self.resource, request)
        except AllocationError as exc:
            log.warning(
                "allocate refused", extra={"resource": self.resource, "reason": exc.message}
            )
            await context.abort(exc.code, exc.message)
            raise AssertionError("context.abort returned") from exc

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        """Not required (the options say so); answered for completeness."""
        return api_pb2.PreStartContainerResponse()


class PluginEndpoint:
    """The gRPC server of one resource on `<plugin-dir>/<socket_name(resource)>`."""

    def __init__(
        self,
        resource: str,
        plugin_dir: Path,
        rm: ResourceManager,
        allocations: Allocations,
        *,
        dial_timeout_s: float = 5.0,
    ) -> None:
        self.resource = resource
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name(resource)
        self.socket_path = plugin_dir / self.socket_name
        self._rm = rm
        self._allocations = allocations
        self._dial_timeout_s = dial_timeout_s
        self._server: grpc.aio.Server | None = None
        self._stop = asyncio.Event()
        self.inode: int | None = None

    @property
    def serving(self) -> bool:
        """True while the server runs."""
        return self._server is not None

    async def start(self) -> None:
        """Serve the socket (replacing a stale file) and dial it to confirm it answers."""
        if len(str(self.socket_path).encode()) > _MAX_SOCKET_PATH:
            raise EndpointError(
                f"socket path {self.socket_path} is longer than {_MAX_SOCKET_PATH} bytes"
            )
        self._stop = asyncio.Event()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            DevicePluginServicer(self.resource, self._rm, self._allocations, self._stop), server
        )
        self.socket_path.unlink(missing_ok=True)
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError as exc:
            raise EndpointError(f"cannot listen on {self.socket_path}: {exc}") from exc
        await server.start()
        self._server = server
        self.inode = self.socket_path.stat().st_ino
        try:
            await self._dial_self()
        except BaseException:
            await self.stop(0)
            raise

    async def _dial_self(self) -> None:
        async with grpc.aio.insecure_channel(f"unix:{self.socket_path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            try:
                await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=self._dial_timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise EndpointError(
                    f"own socket {self.socket_path} does not answer: {exc.details()}"
                ) from exc

    async def register(self, kubelet_socket: Path, timeout_s: float = 5.0) -> None:
        """Register this resource with the kubelet on `kubelet_socket`."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource,
            options=api_pb2.DevicePluginOptions(
                pre_start_required=False, get_preferred_allocation_available=True
            ),
        )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            try:
                await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise EndpointError(
                    f"kubelet on {kubelet_socket} refused registration of {self.resource}:"
                    f" {exc.code().name}: {exc.details()}"
                ) from exc
        log.info("registered", extra={"resource": self.resource, "endpoint": self.socket_name})

    def socket_intact(self) -> bool:
        """True when our socket file is still the one we serve (the kubelet wipes the dir)."""
        try:
            return self.socket_path.stat().st_ino == self.inode
        except FileNotFoundError:
            return False

    async def stop(self, grace: float | None) -> None:
        """End the ListAndWatch streams, stop serving and remove the socket."""
        self._stop.set()
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
        if self.socket_intact():
            self.socket_path.unlink(missing_ok=True)
        self.inode = None
