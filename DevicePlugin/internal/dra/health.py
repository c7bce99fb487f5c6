"""The kubelet's DRA health API (DRAResourceHealth v1alpha1) on the plugin's service socket.

The kubelet (with ResourceHealthStatus on: beta, on by default from 1.36) opens one
NodeWatchResources stream per plugin and shows each prepared device's health in its pods'
status (`allocatedResourcesStatus`). Each stream follows the Runtime's WatchDevices and sends
the complete list, the health of every device the pool publishes by pool and device name
(with the Runtime's reason as its message), at once, on each change, and every `refresh_s`
seconds: the kubelet takes a device it has not heard of within its health check timeout
(sent as 3 refreshes; 30 s where the kubelet ignores it) as unknown. When the Runtime goes
away the stream ends with UNAVAILABLE: the kubelet then forgets the driver's health (unknown)
and opens a new stream a few seconds later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

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


REFRESH_S = 10.0
"""How often the complete list is sent again without a change."""


class DeviceHealth(NamedTuple):
    """One published device's health and, when unhealthy, why."""

    healthy: bool
    message: str


def device_health(devices: Sequence[pb.Device]) -> dict[str, DeviceHealth]:
    """The health of every device the pool can publish (slices.py), by ResourceSlice device
    name: a MIG-mode GPU's instances (unhealthy with their GPU), any other device itself.
    Devices of an unknown kind or without a mode are not published."""
    out: dict[str, DeviceHealth] = {}
    for device in devices:
        kind = by_value(device.kind)
        if kind is None or device.mode == pb.DEVICE_MODE_UNSPECIFIED:
            continue
        healthy = device.health != pb.HEALTH_UNHEALTHY
        reason = "" if healthy else device.health_reason
        if device.mode != pb.DEVICE_MODE_MIG:
            out[device_name(device)] = DeviceHealth(healthy, reason)
        elif kind.shareable:
            for instance in device.mig_instances:
                bad = instance.health == pb.HEALTH_UNHEALTHY
                message = reason or ("MIG instance unhealthy" if bad else "")
                out[mig_name(device, instance)] = DeviceHealth(healthy and not bad, message)
    return out


def _message(
    pool: str, states: Mapping[str, DeviceHealth], now: int, timeout_s: int
) -> health.NodeWatchResourcesResponse:
    return health.NodeWatchResourcesResponse(
        devices=[
            health.DeviceHealth(
                device=health.DeviceIdentifier(pool_name=pool, device_name=name),
                health=health.HEALTHY if state.healthy else health.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=timeout_s,
                message=state.message,
            )
            for name, state in sorted(states.items())
        ]
    )


class HealthServicer(health_grpc.DRAResourceHealthServicer):
    """NodeWatchResources for the pool `pool` (the node's), from the Runtime's device watch."""

    def __init__(self, runtime: RuntimeClient, pool: str, refresh_s: float = REFRESH_S) -> None:
        self._runtime = runtime
        self._pool = pool
        self._refresh_s = refresh_s

    async def NodeWatchResources(
        self, request: health.NodeWatchResourcesRequest, context: Context
    ) -> AsyncIterator[health.NodeWatchResourcesResponse]:
        """The complete list at once, on each change and every `refresh_s`, until the Runtime
        or the kubelet leaves."""
        inventory: dict[str, pb.Device] = {}
        changed = asyncio.Event()

        async def follow() -> None:
            nonlocal inventory
            async with contextlib.aclosing(self._runtime.watch_devices()) as events:
                async for event in events:
                    inventory = apply_event(inventory, event)
                    changed.set()

        timeout_s = max(1, round(3 * self._refresh_s))
        follower = asyncio.create_task(follow(), name="health-watch")
        try:
            while True:
                waiter = asyncio.create_task(changed.wait())
                await asyncio.wait(
                    {follower, waiter},
                    timeout=self._refresh_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waiter.cancel()
                if follower.done():
                    break
                if changed.is_set() or inventory:
                    changed.clear()
                    states = device_health(list(inventory.values()))
                    yield _message(self._pool, states, int(time.time()), timeout_s)
        finally:
            follower.cancel()
            await asyncio.wait({follower})
        error = None if follower.cancelled() else follower.exception()
        if isinstance(error, RuntimeUnavailableError | RuntimeCallError):
            log.warning("health stream ended: Runtime unavailable", extra={"reason": str(error)})
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"Runtime unavailable: {error}")
        if error is not None:
            raise error
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the Runtime's device watch ended")
