"""Async client of the Runtime (`lingjun.runtime.v1`) over its unix socket.

Adopting the official Runtime proto later touches this module only. Unary
calls are retried with tenacity on UNAVAILABLE for a bounded time; then a
RuntimeUnavailableError names the socket. Other gRPC failures become a
RuntimeCallError carrying the Runtime's status code and message. A service of
the same socket defined by a component (the Controller's node-feature switch)
goes through `RuntimeClient.call` on the same channel and policy.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2_grpc as pb_grpc
from lj_runtimekit.proto.pkg.version import Version, parse_version

DEFAULT_SOCKET_DIR = "/run/amp/eKitC/xdm/sockets/"
DEFAULT_SOCKET_NAME = "runtime.sock"

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class RuntimeUnavailableError(ConnectionError):
    """The Runtime does not answer on its socket (after bounded retries)."""


class RuntimeCallError(RuntimeError):
    """The Runtime answered a call with an error status."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"Runtime {method} failed: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of unary calls while the Runtime is unavailable."""

    attempts: int = 5
    max_delay_s: float = 10.0
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    call_timeout_s: float = 5.0


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


class RuntimeClient:
    """Client of the shared Runtime services on one socket."""

    def __init__(
        self,
        socket_dir: str | Path = DEFAULT_SOCKET_DIR,
        socket_name: str = DEFAULT_SOCKET_NAME,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.socket_path = Path(socket_dir) / socket_name
        self.retry = retry or RetryPolicy()
        self._channel: grpc.aio.Channel | None = None
        self._stubs: _Stubs | None = None
        self._version: Version | None = None

    @property
    def target(self) -> str:
        """gRPC target of the socket."""
        return f"unix://{self.socket_path.absolute()}"

    def _connected(self) -> _Stubs:
        if self._stubs is None:
            self._channel = grpc.aio.insecure_channel(self.target)
            self._stubs = _Stubs(self._channel)
        return self._stubs

    async def close(self) -> None:
        """Close the channel; the client may be used again afterwards."""
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stubs = None

    async def __aenter__(self) -> RuntimeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, invoke: Callable[[_Stubs], Awaitable[_T]]) -> _T:
        policy = self.retry
        retrying = AsyncRetrying(
            retry=retry_if_exception(_unavailable),
            stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.max_delay_s),
            wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
            reraise=False,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await invoke(self._connected())
        except RetryError as exc:
            last = exc.last_attempt.exception()
            detail = last.details() if isinstance(last, grpc.aio.AioRpcError) else str(last)
            state = "exists" if self.socket_path.exists() else "does not exist"
            raise RuntimeUnavailableError(
                f"Runtime not reachable on socket {self.socket_path} (the file {state})"
                f" after {policy.attempts} attempts: {detail}"
            ) from exc
        except grpc.aio.AioRpcError as exc:
            raise RuntimeCallError(method, exc.code(), exc.details() or "") from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def call(self, method: str, invoke: Callable[[grpc.aio.Channel], Awaitable[_T]]) -> _T:
        """One unary call of a service outside the shared contract (served on the same
        socket), on this client's channel, with its retry policy and errors. `invoke` builds
        its stub on the channel and makes the call with `timeout=self.retry.call_timeout_s`;
        `method` names the RPC in errors."""
        return await self._call(method, lambda stubs: invoke(stubs.channel))

    # RuntimeService

    async def runtime_info(self) -> pb.RuntimeInfo:
        """Version and capabilities of the Runtime."""
        info: pb.RuntimeInfo = await self._call(
            "GetRuntimeInfo",
            lambda stubs: stubs.runtime.GetRuntimeInfo(
                pb.GetRuntimeInfoRequest(), timeout=self.retry.call_timeout_s
            ),
        )
        self._version = parse_version(info.version, what=f"Runtime version on {self.socket_path}")
        return info

    async def version(self) -> Version:
        """The Runtime version (asked once, then cached), for feature gates."""
        if self._version is None:
            await self.runtime_info()
        assert self._version is not None
        return self._version

    # DeviceService

    async def list_devices(self) -> list[pb.Device]:
        """The node's full device inventory."""
        response = await self._call(
            "ListDevices",
            lambda stubs: stubs.device.ListDevices(
                pb.ListDevicesRequest(), timeout=self.retry.call_timeout_s
            ),
        )
        return list(response.devices)

    async def watch_devices(self) -> AsyncGenerator[pb.DeviceEvent, None]:
        """Inventory snapshot, then one event per change. Not retried: callers reconnect."""
        stream = self._connected().device.WatchDevices(pb.WatchDevicesRequest())
        try:
            async for event in stream:
                yield event
        except grpc.aio.AioRpcError as exc:
            if _unavailable(exc) or exc.code() == grpc.StatusCode.CANCELLED:
                raise RuntimeUnavailableError(
                    f"Runtime watch on socket {self.socket_path} ended: {exc.details()}"
                ) from exc
            raise RuntimeCallError("WatchDevices", exc.code(), exc.details() or "") from exc
        finally:
            stream.cancel()

    # AllocationService

    async def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        """Reserve devices for a container and get its injection spec (idempotent)."""
        return await self._call(
            "Allocate",
            lambda stubs: stubs.allocation.Allocate(request, timeout=self.retry.call_timeout_s),
        )

    async def release(self, container_key: str) -> bool:
        """Free a container's allocation; True when something was freed."""
        response: pb.ReleaseResponse = await self._call(
            "Release",
            lambda stubs: stubs.allocation.Release(
                pb.ReleaseRequest(container_key=container_key), timeout=self.retry.call_timeout_s
            ),
        )
        return response.released

    async def list_allocations(self) -> list[pb.Allocation]:
        """Every container allocation the Runtime holds."""
        response = await self._call(
            "ListAllocations",
            lambda stubs: stubs.allocation.ListAllocations(
                pb.ListAllocationsRequest(), timeout=self.retry.call_timeout_s
            ),
        )
        return list(response.allocations)

    # MetricsService

    async def device_metrics(self) -> pb.GetDeviceMetricsResponse:
        """One sample per device and MIG instance."""
        return await self._call(
            "GetDeviceMetrics",
            lambda stubs: stubs.metrics.GetDeviceMetrics(
                pb.GetDeviceMetricsRequest(), timeout=self.retry.call_timeout_s
            ),
        )

    async def container_metrics(self) -> pb.GetContainerMetricsResponse:
        """One sample per allocated container and device."""
        return await self._call(
            "GetContainerMetrics",
            lambda stubs: stubs.metrics.GetContainerMetrics(
                pb.GetContainerMetricsRequest(), timeout=self.retry.call_timeout_s
            ),
        )


class _Stubs:
    """The channel and the generated stubs of every shared Runtime service on it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.runtime = pb_grpc.RuntimeServiceStub(channel)
        self.device = pb_grpc.DeviceServiceStub(channel)
        self.allocation = pb_grpc.AllocationServiceStub(channel)
        self.metrics = pb_grpc.MetricsServiceStub(channel)
