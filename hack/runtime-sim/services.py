"""gRPC servicers of the Runtime contract (lingjun.runtime.v1) over the simulator state: the
shared services of `proto/` and the Controller's node-feature switch."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn, TypeAlias

import grpc

from lj_runtimekit.controller.pkg.configpb import config_service_pb2, config_service_pb2_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.featuregate import FEATURE_MINIMUMS
from lj_runtimekit.proto.pkg.version import Version, parse_version
from lj_runtimekit.runtimesim.allocation import (
    WHOLE,
    AllocationError,
    AllocationRequest,
    Allocator,
    ContainerAllocation,
    Grant,
)
from lj_runtimekit.runtimesim.injection import build_spec
from lj_runtimekit.runtimesim.metrics import MetricsModel
from lj_runtimekit.runtimesim.state import DeviceView, Health, NodeState

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

API_VERSION = "v1"
_MODES = {
    "exclusive": runtime_pb2.DEVICE_MODE_EXCLUSIVE,
    "tdm": runtime_pb2.DEVICE_MODE_TDM,
    "mig": runtime_pb2.DEVICE_MODE_MIG,
}
_LINKS = {
    "pcie": runtime_pb2.INTERCONNECT_KIND_PCIE,
    "nvlink": runtime_pb2.INTERCONNECT_KIND_NVLINK,
}
_EVENTS = {
    "snapshot": runtime_pb2.DeviceEvent.TYPE_SNAPSHOT,
    "modified": runtime_pb2.DeviceEvent.TYPE_MODIFIED,
}
# Capabilities by the minimum Runtime version that has them (docs/architecture.md,
# Versions and feature gates); a gated device kind's comes from the device-kind table.
_CAPABILITIES: tuple[tuple[Version, tuple[str, ...]], ...] = (
    (Version(1, 13, 0), ("exclusive", "tdm", "metrics")),
    (Version(1, 14, 0), ("mig", "container-metrics")),
    (Version(1, 15, 0), ("topology",)),
)


def capabilities(version: str) -> list[str]:
    """Capability names a Runtime of this version reports: the features', then the name of
    each device kind behind a feature gate from that gate's minimum version on."""
    current = parse_version(version)
    named = [name for minimum, names in _CAPABILITIES if current >= minimum for name in names]
    return named + [
        k.name
        for k in devicekind.kinds()
        if k.feature is not None and current >= FEATURE_MINIMUMS[k.feature]
    ]


def _kind_value(kind: str) -> runtime_pb2.DeviceKind.ValueType:
    """The contract's enum value of a simulated kind: the device-kind table's."""
    known = devicekind.by_name(kind)
    if known is None:
        raise KeyError(f"device kind {kind!r} is not in the device-kind table")
    return runtime_pb2.DeviceKind.ValueType(known.value)


def _health(health: Health) -> runtime_pb2.Health.ValueType:
    return runtime_pb2.HEALTH_HEALTHY if health.healthy else runtime_pb2.HEALTH_UNHEALTHY


def device_message(view: DeviceView) -> runtime_pb2.Device:
    """The contract message of a device with its health."""
    info = view.info
    return runtime_pb2.Device(
        id=info.id,
        index=info.index,
        kind=_kind_value(info.kind),
        model=info.model,
        memory_bytes=info.memory_bytes,
        numa_node=info.numa_node,
        peers=[
            runtime_pb2.Interconnect(
                peer_id=p.peer_id,
                kind=_LINKS[p.kind],
                links=p.links,
                bandwidth_gbps=p.bandwidth_gbps,
            )
            for p in info.peers
        ],
        mode=_MODES[info.mode],
        mig_instances=[
            runtime_pb2.MigInstance(
                id=m.id,
                profile=m.profile.name,
                instance_id=m.instance_id,
                memory_bytes=m.profile.memory_bytes,
                compute_slices=m.profile.compute_slices,
                health=_health(health),
                parent_id=m.parent_id,
            )
            for m, health in zip(info.mig_instances, view.mig_health, strict=True)
        ],
        health=_health(view.health),
        health_reason=view.health.reason,
        pci_bus_id=info.pci_bus_id,
    )


def grant(device: runtime_pb2.DeviceRequest) -> Grant:
    """A contract DeviceRequest as a Grant: 0 means whole unless the request is a slice."""
    if device.slice:
        return Grant(device.device_id, device.core_percent, device.memory_percent)
    return Grant(device.device_id, device.core_percent or WHOLE, device.memory_percent or WHOLE)


def allocation_message(allocation: ContainerAllocation) -> runtime_pb2.Allocation:
    """The contract message of a recorded allocation."""
    request = allocation.request
    return runtime_pb2.Allocation(
        container_key=request.container_key,
        pod_namespace=request.pod_namespace,
        pod_name=request.pod_name,
        container_name=request.container_name,
        pod_uid=request.pod_uid,
        devices=[
            runtime_pb2.DeviceRequest(
                device_id=g.device_id,
                core_percent=g.core_percent,
                memory_percent=g.memory_percent,
                slice=not g.whole,
            )
            for g in request.grants
        ],
        init_container=request.init_container,
        claim_uid=request.claim_uid,
        claim_name=request.claim_name,
    )


async def abort(context: Context, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the RPC with a status (``context.abort`` raises, which its stubs do not say)."""
    await context.abort(code, message)
    raise AssertionError("context.abort returned")


def _now_ms() -> int:
    return int(time.time() * 1000)


class RuntimeService(runtime_pb2_grpc.RuntimeServiceServicer):
    """Reports the simulated Runtime's version and capabilities."""

    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def GetRuntimeInfo(
        self, request: runtime_pb2.GetRuntimeInfoRequest, context: Context
    ) -> runtime_pb2.RuntimeInfo:
        """Version, capabilities, node name and contract version."""
        version = self._state.version
        return runtime_pb2.RuntimeInfo(
            version=version,
            capabilities=capabilities(version),
            node_name=self._state.node_name,
            api_version=API_VERSION,
        )


class DeviceService(runtime_pb2_grpc.DeviceServiceServicer):
    """Serves the inventory and its changes."""

    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def ListDevices(
        self, request: runtime_pb2.ListDevicesRequest, context: Context
    ) -> runtime_pb2.ListDevicesResponse:
        """Every device, ordered by index."""
        return runtime_pb2.ListDevicesResponse(
            devices=[device_message(v) for v in self._state.views()]
        )

    async def WatchDevices(
        self, request: runtime_pb2.WatchDevicesRequest, context: Context
    ) -> AsyncIterator[runtime_pb2.DeviceEvent]:
        """A snapshot event, then one event per change."""
        async for event in self._state.watch():
            yield runtime_pb2.DeviceEvent(
                type=_EVENTS[event.type],
                devices=[device_message(v) for v in event.devices],
                revision=event.revision,
            )


class AllocationService(runtime_pb2_grpc.AllocationServiceServicer):
    """Turns container assignments into injection specs."""

    def __init__(self, allocator: Allocator) -> None:
        self._allocator = allocator

    async def Allocate(
        self, request: runtime_pb2.AllocateRequest, context: Context
    ) -> runtime_pb2.AllocateResponse:
        """Reserve the container's devices; the same request again answers the same."""
        asked = AllocationRequest(
            container_key=request.container_key,
            pod_namespace=request.pod_namespace,
            pod_name=request.pod_name,
            pod_uid=request.pod_uid,
            container_name=request.container_name,
            grants=tuple(grant(d) for d in request.devices),
            init_container=request.init_container,
            claim_uid=request.claim_uid,
            claim_name=request.claim_name,
        )
        try:
            allocation = self._allocator.allocate(asked)
        except AllocationError as exc:
            await abort(context, exc.code, exc.message)
        return runtime_pb2.AllocateResponse(
            spec=build_spec(allocation), allocation=allocation_message(allocation)
        )

    async def Release(
        self, request: runtime_pb2.ReleaseRequest, context: Context
    ) -> runtime_pb2.ReleaseResponse:
        """Free the container's devices; releasing twice is not an error."""
        return runtime_pb2.ReleaseResponse(released=self._allocator.release(request.container_key))

    async def ListAllocations(
        self, request: runtime_pb2.ListAllocationsRequest, context: Context
    ) -> runtime_pb2.ListAllocationsResponse:
        """Every allocation, ordered by container key."""
        return runtime_pb2.ListAllocationsResponse(
            allocations=[allocation_message(a) for a in self._allocator.allocations()]
        )


class NodeFeatureService(config_service_pb2_grpc.NodeFeatureServiceServicer):
    """The node's feature switch, stateful and idempotent."""

    def __init__(self, state: NodeState) -> None:
        self._state = state

    def _answer(self, changed: bool) -> config_service_pb2.FeatureState:
        features = self._state.features
        return config_service_pb2.FeatureState(
            enabled=features.enabled,
            changed=changed,
            changed_at_unix=features.changed_at_unix,
            changed_by=features.changed_by,
        )

    async def EnableFeatures(
        self, request: config_service_pb2.EnableFeaturesRequest, context: Context
    ) -> config_service_pb2.FeatureState:
        """Turn the features on; ``changed`` is false when they already were."""
        return self._answer(self._state.set_features(True, request.requester))

    async def DisableFeatures(
        self, request: config_service_pb2.DisableFeaturesRequest, context: Context
    ) -> config_service_pb2.FeatureState:
        """Turn the features off; ``changed`` is false when they already were."""
        return self._answer(self._state.set_features(False, request.requester))

    async def GetFeatureState(
        self, request: config_service_pb2.GetFeatureStateRequest, context: Context
    ) -> config_service_pb2.FeatureState:
        """The feature switch as it is."""
        return self._answer(False)


class MetricsService(runtime_pb2_grpc.MetricsServiceServicer):
    """Device, MIG instance and per-container samples."""

    def __init__(self, model: MetricsModel) -> None:
        self._model = model

    async def GetDeviceMetrics(
        self, request: runtime_pb2.GetDeviceMetricsRequest, context: Context
    ) -> runtime_pb2.GetDeviceMetricsResponse:
        """The next device sample."""
        return runtime_pb2.GetDeviceMetricsResponse(
            devices=self._model.device_metrics(), timestamp_unix_ms=_now_ms()
        )

    async def GetContainerMetrics(
        self, request: runtime_pb2.GetContainerMetricsRequest, context: Context
    ) -> runtime_pb2.GetContainerMetricsResponse:
        """Per-container usage at the current sample."""
        return runtime_pb2.GetContainerMetricsResponse(
            containers=self._model.container_metrics(), timestamp_unix_ms=_now_ms()
        )
