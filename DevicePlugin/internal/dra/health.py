"""The kubelet's DRA health API (DRAResourceHealth v1alpha1) on the plugin's service socket.

The kubelet (with ResourceHealthStatus on) opens one NodeWatchResources stream per plugin and
shows each prepared device's health in its pods' status (`allocatedResourcesStatus`). Each
stream follows the Runtime's WatchDevices and sends the health of every device the pool
publishes, by pool and device name, whenever it changes (the first message: all of them).
When the Runtime goes away the stream ends with UNAVAILABLE: the kubelet then forgets the
driver's health (unknown) and opens a new stream a few seconds later.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeAlias

import grpc

from lj_runtimekit.deviceplugin.internal.dra.naming import device_name, mig_name
from lj_runtimekit.deviceplugin.internal.dra.publisher import apply_event
from lj_runtimekit.proto.k8s.drahealth.v1alpha1 import api_pb2 as health
from lj_runtimekit.proto.k8s.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.devicekind import by_value
from lj_runtimekit.proto.pkg.runtimeclient import (
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)

log = logging.getLogger(__name__)

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def device_health(devices: Sequence[pb.Device]) -> dict[str, bool]:
    """Healthy or not, by ResourceSlice device name, for every device the pool can publish
    (slices.py): a MIG-mode GPU's instances (unhealthy with their GPU), any other device
    itself. Devices of an unknown kind or without a mode are not published."""
    out: dict[str, bool] = {}
    for device in devices:
        kind = by_value(device.kind)
        if kind is None or device.mode == pb.DEVICE_MODE_UNSPECIFIED:
            continue
        healthy = device.health != pb.HEALTH_UNHEALTHY
        if device.mode != pb.DEVICE_MODE_MIG:
            out[device_name(device)] = healthy
        elif kind.shareable:
            for instance in device.mig_instances:
                out[mig_name(device, instance)] = healthy and instance.health != pb.HEALTH_UNHEALTHY
    return out


def _message(pool: str, states: Mapping[str, bool], now: int) -> health.NodeWatchResourcesResponse:
    return health.NodeWatchResourcesResponse(
        devices=[
            health.DeviceHealth(
                device=health.DeviceIdentifier(pool_name=pool, device_name=name),
                health=health.HEALTHY if healthy else health.UNHEALTHY,
                last_updated_time=now,
            )
            for name, healthy in sorted(states.items())
        ]
    )


class HealthServicer(health_grpc.DRAResourceHealthServicer):
    """NodeWatchResources for the pool `pool` (the node's), from the Runtime's device watch."""

    def __init__(self, runtime: RuntimeClient, pool: str) -> None:
        self._runtime = runtime
        self._pool = pool

    async def NodeWatchResources(
        self, request: health.NodeWatchResourcesRequest, context: Context
    ) -> AsyncIterator[health.NodeWatchResourcesResponse]:
        """Every device's health, then each change, until the Runtime or the kubelet leaves."""
        devices: dict[str, pb.Device] = {}
        sent: dict[str, bool] | None = None
        try:
            async with contextlib.aclosing(self._runtime.watch_devices()) as events:
                async for event in events:
                    devices = apply_event(devices, event)
                    states = device_health(list(devices.values()))
                    if states == sent:
                        continue
                    yield _message(self._pool, states, int(time.time()))
                    sent = states
        except (RuntimeUnavailableError, RuntimeCallError) as exc:
            log.warning("health stream ended: Runtime unavailable", extra={"reason": str(exc)})
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"Runtime unavailable: {exc}")
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the Runtime's device watch ended")
