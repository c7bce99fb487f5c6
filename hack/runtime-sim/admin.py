"""SimulatorAdmin servicer: fault injection into a running simulator."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc

from lj_runtimekit.proto.lingjun.runtimesim.v1 import admin_pb2, admin_pb2_grpc
from lj_runtimekit.runtimesim.faults import Faults
from lj_runtimekit.runtimesim.services import Context, abort
from lj_runtimekit.runtimesim.state import NodeState

log = logging.getLogger(__name__)

MAX_DOWN_MS = 600_000


class SimulatorAdmin(admin_pb2_grpc.SimulatorAdminServicer):
    """Applies admin requests to the node state, the faults and the Runtime socket."""

    def __init__(
        self,
        state: NodeState,
        faults: Faults,
        restart_socket: Callable[[int], Awaitable[None]],
    ) -> None:
        self._state = state
        self._faults = faults
        self._restart_socket = restart_socket

    async def SetDeviceHealth(
        self, request: admin_pb2.SetDeviceHealthRequest, context: Context
    ) -> admin_pb2.AdminResponse:
        """Mark a device or MIG instance healthy or unhealthy."""
        try:
            changed = self._state.set_health(request.device_id, request.healthy, request.reason)
        except KeyError:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"no device {request.device_id!r}")
        health = "healthy" if request.healthy else "unhealthy"
        verb = "is now" if changed else "was already"
        return admin_pb2.AdminResponse(message=f"device {request.device_id} {verb} {health}")

    async def RestartSocket(
        self, request: admin_pb2.RestartSocketRequest, context: Context
    ) -> admin_pb2.AdminResponse:
        """Close the Runtime socket now; it is served again after ``down_ms``."""
        if request.down_ms > MAX_DOWN_MS:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"down_ms {request.down_ms} is more than {MAX_DOWN_MS}",
            )
        await self._restart_socket(request.down_ms)
        return admin_pb2.AdminResponse(
            message=f"runtime socket closed, serving again in {request.down_ms} ms"
        )

    async def SetLatency(
        self, request: admin_pb2.SetLatencyRequest, context: Context
    ) -> admin_pb2.AdminResponse:
        """Add a delay to every Runtime RPC."""
        self._faults.set_latency(request.latency_ms)
        return admin_pb2.AdminResponse(message=f"latency {request.latency_ms} ms")

    async def FailAllocations(
        self, request: admin_pb2.FailAllocationsRequest, context: Context
    ) -> admin_pb2.AdminResponse:
        """Serve `skip` Allocate calls, then fail `count`."""
        self._faults.fail_allocations(request.skip, request.count)
        return admin_pb2.AdminResponse(
            message=f"Allocate: {request.skip} served, then {request.count} fail"
        )

    async def SetErrorRate(
        self, request: admin_pb2.SetErrorRateRequest, context: Context
    ) -> admin_pb2.AdminResponse:
        """Fail a share of Runtime RPCs with UNAVAILABLE."""
        try:
            self._faults.set_error_rate(request.error_rate)
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return admin_pb2.AdminResponse(message=f"error rate {request.error_rate}")

    async def SetVersion(
        self, request: admin_pb2.SetVersionRequest, context: Context
    ) -> admin_pb2.AdminResponse:
        """Change the reported Runtime version."""
        try:
            version = self._state.set_version(request.version)
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return admin_pb2.AdminResponse(message=f"runtime version {version}")
