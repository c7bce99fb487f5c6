"""The kubelet's device-manager side of the device plugin API v1beta1, for tests and the sandbox.

It does what the kubelet does, on real unix sockets and real gRPC:

- serves `Registration` on `<plugin-dir>/kubelet.sock`; a restart wipes the
  plugin directory and recreates the socket, as the kubelet does at start;
- for each registration, dials the plugin's endpoint and follows its
  `ListAndWatch` stream (a new registration of a resource replaces the old);
- admits pods like the device manager (adding the pod to the `/pods` list
  first when it has one, as the kubelet's pod manager does): per container (init containers
  first), per extended resource served by a plugin, picks healthy free device
  IDs (asking `GetPreferredAllocation` when the plugin offers it), calls
  `Allocate`, keeps the IDs in use until the pod is freed, and merges the
  responses into the container's run options with the kubelet's de-duplication.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit.testkit.podserver import PodListServer

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
CHECKPOINT = "kubelet_internal_checkpoint"


class AdmissionError(Exception):
    """The pod cannot be admitted (as the kubelet's UnexpectedAdmissionError)."""


@dataclass(frozen=True)
class Registration:
    """One Register call the shim accepted."""

    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    at: float


@dataclass
class PluginView:
    """What the shim knows of one registered resource."""

    registration: Registration
    channel: grpc.aio.Channel
    stub: api_pb2_grpc.DevicePluginAsyncStub
    devices: dict[str, api_pb2.Device] = field(default_factory=dict)
    updates: int = 0
    """ListAndWatch messages received."""
    last_update: float = 0.0
    """time.monotonic() of the last ListAndWatch message."""
    first_update: float | None = None
    stream_task: asyncio.Task[None] | None = None
    stream_error: str | None = None


@dataclass
class ContainerOptions:
    """A container's run options merged from its Allocate responses (kubelet semantics)."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, api_pb2.Mount] = field(default_factory=dict)
    devices: dict[str, api_pb2.DeviceSpec] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    device_ids: dict[str, list[str]] = field(default_factory=dict)
    """Resource -> device IDs the kubelet gave the container."""

    def merge(
        self, resource: str, ids: Sequence[str], resp: api_pb2.ContainerAllocateResponse
    ) -> None:
        """Merge one response; the first value of a key or path wins, as in the kubelet."""
        self.device_ids[resource] = list(ids)
        for k, v in resp.envs.items():
            self.envs.setdefault(k, v)
        for m in resp.mounts:
            self.mounts.setdefault(m.container_path, m)
        for d in resp.devices:
            self.devices.setdefault(d.container_path, d)
        for k, v in resp.annotations.items():
            self.annotations.setdefault(k, v)
        for c in resp.cdi_devices:
            if c.name not in self.cdi_devices:
                self.cdi_devices.append(c.name)


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, shim: KubeletShim) -> None:
        self._shim = shim

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        if request.version != API_VERSION:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unsupported device plugin API version {request.version!r}, want {API_VERSION}",
            )
        if "/" not in request.resource_name or not request.endpoint:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid registration: resource {request.resource_name!r}"
                f" endpoint {request.endpoint!r}",
            )
        await self._shim._accept(request)
        return api_pb2.Empty()


class KubeletShim:
    """The device-manager half of a kubelet on `plugin_dir`."""

    def __init__(self, plugin_dir: Path, pod_list: PodListServer | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.pod_list = pod_list
        """When set, `admit` adds the pod to this `/pods` list first, as the kubelet adds a
        pod to its pod manager (which `/pods` serves) right before admitting it."""
        self.socket_path = plugin_dir / KUBELET_SOCKET
        self.registrations: list[Registration] = []
        self.plugins: dict[str, PluginView] = {}
        self.in_use: dict[str, dict[str, str]] = {}
        """Resource -> device ID -> owner `<pod uid>/<container>`."""
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    # lifecycle

    async def start(self) -> None:
        """Serve Registration on kubelet.sock."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        self.socket_path.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        log.info("kubelet shim serving socket=%s", self.socket_path)

    async def stop(self) -> None:
        """Stop serving, drop every plugin connection and remove kubelet.sock."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0)
        self.socket_path.unlink(missing_ok=True)
        for view in list(self.plugins.values()):
            await self._drop(view)
        self.plugins.clear()

    async def restart(self, *, wipe: bool = True) -> None:
        """Restart like a kubelet: forget plugins, wipe the plugin dir, recreate kubelet.sock."""
        await self.stop()
        if wipe:
            for path in self.plugin_dir.iterdir():
                if path.name != CHECKPOINT and not path.is_dir():
                    path.unlink(missing_ok=True)
        await self.start()

    async def __aenter__(self) -> KubeletShim:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # registration and ListAndWatch

    async def _accept(self, request: api_pb2.RegisterRequest) -> None:
        reg = Registration(
            request.resource_name, request.endpoint, request.options, time.monotonic()
        )
        old = self.plugins.pop(reg.resource, None)
        if old is not None:
            await self._drop(old)
        channel = grpc.aio.insecure_channel(f"unix:{self.plugin_dir / reg.endpoint}")
        view = PluginView(reg, channel, api_pb2_grpc.DevicePluginStub(channel))
        self.plugins[reg.resource] = view
        view.stream_task = asyncio.create_task(self._follow(view))
        async with self._changed:
            self.registrations.append(reg)
            self._changed.notify_all()
        log.info("plugin registered resource=%s endpoint=%s", reg.resource, reg.endpoint)

    async def _follow(self, view: PluginView) -> None:
        try:
            async for msg in view.stub.ListAndWatch(api_pb2.Empty()):
                async with self._changed:
                    view.devices = {d.ID: d for d in msg.devices}
                    view.updates += 1
                    view.last_update = time.monotonic()
                    if view.first_update is None:
                        view.first_update = view.last_update
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as exc:
            view.stream_error = f"{exc.code().name}: {exc.details()}"
            async with self._changed:
                self._changed.notify_all()

    async def _drop(self, view: PluginView) -> None:
        if view.stream_task is not None:
            view.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await view.stream_task
        await view.channel.close()

    async def wait_for(self, predicate: Callable[[], bool], within_s: float) -> None:
        """Wait until `predicate()` holds (checked on every registration and list update)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), within_s)

    async def wait_registered(
        self, resources: Sequence[str], within_s: float = 10.0, *, since: float = 0.0
    ) -> None:
        """Wait until every resource registered (at or after `since`) and listed its devices."""

        def ready() -> bool:
            for r in resources:
                view = self.plugins.get(r)
                if view is None or view.registration.at < since or view.first_update is None:
                    return False
            return True

        await self.wait_for(ready, within_s)

    def devices(self, resource: str) -> dict[str, api_pb2.Device]:
        """The resource's devices as last listed."""
        view = self.plugins.get(resource)
        return dict(view.devices) if view else {}

    def healthy(self, resource: str) -> list[str]:
        """IDs of the resource's healthy devices."""
        return sorted(i for i, d in self.devices(resource).items() if d.health == HEALTHY)

    # calls

    def _view(self, resource: str) -> PluginView:
        view = self.plugins.get(resource)
        if view is None:
            raise AdmissionError(f"no device plugin registered for {resource}")
        return view

    async def allocate(
        self, resource: str, device_ids: Sequence[Sequence[str]], deadline_s: float = 10.0
    ) -> api_pb2.AllocateResponse:
        """Call Allocate with one container request per ID list."""
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in device_ids
            ]
        )
        return await self._view(resource).stub.Allocate(request, timeout=deadline_s)

    async def preferred(
        self,
        resource: str,
        available: Sequence[str],
        size: int,
        must_include: Sequence[str] = (),
        deadline_s: float = 10.0,
    ) -> list[str]:
        """Call GetPreferredAllocation for one container."""
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = await self._view(resource).stub.GetPreferredAllocation(
            request, timeout=deadline_s
        )
        return list(response.container_responses[0].deviceIDs)

    async def admit(self, pod: Mapping[str, Any]) -> dict[str, ContainerOptions]:
        """Allocate every device resource of a pod (PodList item JSON), container by container.

        Returns container name -> merged run options. Raises AdmissionError (with
        the plugin's message) when a call fails; devices taken so far stay in use
        until `free`, as in the kubelet.
        """
        if self.pod_list is not None:
            self.pod_list.put(pod)
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        uid = str(meta.get("uid", ""))
        ref = f"{meta.get('namespace')}/{meta.get('name')}"
        out: dict[str, ContainerOptions] = {}
        for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            name = str(container.get("name"))
            options = ContainerOptions()
            limits = (container.get("resources") or {}).get("limits") or {}
            for resource, quantity in limits.items():
                if resource not in self.plugins:
                    continue
                ids = await self._pick(resource, int(quantity), f"{uid}/{name}")
                try:
                    response = await self.allocate(resource, [ids])
                except grpc.aio.AioRpcError as exc:
                    raise AdmissionError(
                        f"pod {ref} container {name}: Allocate of {resource} failed:"
                        f" {exc.code().name}: {exc.details()}"
                    ) from exc
                options.merge(resource, ids, response.container_responses[0])
            out[name] = options
        return out

    async def _pick(self, resource: str, needed: int, owner: str) -> list[str]:
        view = self._view(resource)
        used = self.in_use.setdefault(resource, {})
        available = [i for i in self.healthy(resource) if i not in used]
        if len(available) < needed:
            raise AdmissionError(
                f"requested {needed} of {resource}, only {len(available)} healthy and free"
            )
        chosen: list[str] = []
        if view.registration.options.get_preferred_allocation_available:
            try:
                preferred = await self.preferred(resource, available, needed)
            except grpc.aio.AioRpcError as exc:
                log.warning("preferred allocation failed resource=%s reason=%s", resource, exc)
                preferred = []
            free = set(available)
            chosen = [i for i in dict.fromkeys(preferred) if i in free][:needed]
        chosen += [i for i in available if i not in chosen][: needed - len(chosen)]
        for i in chosen:
            used[i] = owner
        return chosen

    def free(self, pod_uid: str) -> int:
        """Release the device IDs of a pod (as when it terminates); return how many."""
        n = 0
        for used in self.in_use.values():
            for device, owner in list(used.items()):
                if owner.startswith(pod_uid + "/"):
                    del used[device]
                    n += 1
        return n
