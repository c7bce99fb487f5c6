"""Injected faults on the Runtime server: added latency and a failure rate."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

log = logging.getLogger(__name__)

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

UNAVAILABLE_MESSAGE = "simulated Runtime failure (error rate fault)"
ALLOCATE_FAILURE_MESSAGE = "simulated Runtime failure (failing Allocate fault)"
ALLOCATE_METHOD = "/lingjun.runtime.v1.AllocationService/Allocate"


class Faults:
    """The faults in force now; the failure draw is seeded, so reproducible."""

    def __init__(self, seed: int) -> None:
        self.latency_ms = 0
        self.error_rate = 0.0
        self.allocate_skip = 0
        self.allocate_failures = 0
        self._rng = random.Random(f"{seed}/faults")  # noqa: S311 (simulation, not security)

    def set_latency(self, latency_ms: int) -> None:
        """Add this many milliseconds to every Runtime RPC (0 turns it off)."""
        self.latency_ms = latency_ms
        log.info("fault latency set latency_ms=%d", latency_ms)

    def set_error_rate(self, rate: float) -> None:
        """Fail this share (0..1) of Runtime RPCs; raise ValueError outside 0..1."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"error rate {rate} is outside 0..1")
        self.error_rate = rate
        log.info("fault error rate set error_rate=%s", rate)

    def fail_allocations(self, skip: int, count: int) -> None:
        """Serve the next `skip` Allocate calls, then fail `count` of them."""
        self.allocate_skip, self.allocate_failures = skip, count
        log.info("fault failing allocations set skip=%d count=%d", skip, count)

    def allocate_fails(self) -> bool:
        """Whether this Allocate call fails (and count it)."""
        if not self.allocate_failures:
            return False
        if self.allocate_skip:
            self.allocate_skip -= 1
            return False
        self.allocate_failures -= 1
        return True

    def should_fail(self) -> bool:
        """Draw whether the next RPC fails."""
        return self.error_rate > 0 and self._rng.random() < self.error_rate


class FaultInterceptor(grpc.aio.ServerInterceptor):
    """Delays every RPC by the latency fault and fails a share of them with UNAVAILABLE."""

    def __init__(self, faults: Faults) -> None:
        self._faults = faults

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        """Apply the faults in force, then hand over to the real handler."""
        if self._faults.latency_ms:
            await asyncio.sleep(self._faults.latency_ms / 1000)
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler_call_details.method == ALLOCATE_METHOD and self._faults.allocate_fails():
            log.info("fault injected method=%s", handler_call_details.method)
            return grpc.unary_unary_rpc_method_handler(
                _fail_allocate,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if not self._faults.should_fail():
            return handler
        log.info("fault injected method=%s", handler_call_details.method)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _fail_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            _fail_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def _fail_unary(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAVAILABLE, UNAVAILABLE_MESSAGE)


async def _fail_allocate(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.INTERNAL, ALLOCATE_FAILURE_MESSAGE)


async def _fail_stream(
    request: object, context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[None]:
    await context.abort(grpc.StatusCode.UNAVAILABLE, UNAVAILABLE_MESSAGE)
    yield None
