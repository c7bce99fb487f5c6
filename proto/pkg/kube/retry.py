"""Bounded retries of API calls (tenacity): exponential backoff with jitter, each retry
logged, failures raised as KubeError.

Blocking calls (the official client is synchronous) are retried with `call`, or from
asyncio with `call_async`, which runs each try in a thread (an executor when given).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from lj_runtimekit.proto.pkg.kube.errors import KubeError, api_error, transient

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryPolicy:
    """At most `attempts` tries (None: no bound) within `timeout_s` (None: no bound),
    waiting `initial_s`, then twice as long each time, plus up to `jitter_s` at random,
    and never more than `max_backoff_s`."""

    attempts: int | None = 8
    timeout_s: float | None = 30.0
    initial_s: float = 0.2
    max_backoff_s: float = 5.0
    jitter_s: float = 1.0

    def stop(self) -> stop_base:
        """The tenacity stop condition of these bounds."""
        stop: stop_base = stop_never
        if self.attempts is not None:
            stop = stop_after_attempt(self.attempts)
        if self.timeout_s is not None:
            stop = stop | stop_after_delay(self.timeout_s)
        return stop

    def wait(self) -> wait_exponential_jitter:
        """The tenacity wait of this backoff."""
        return wait_exponential_jitter(
            multiplier=self.initial_s, max=self.max_backoff_s, jitter=self.jitter_s
        )


def log_retry(what: str) -> Callable[[RetryCallState], None]:
    """A tenacity `before_sleep` that logs the failed try of `what` and the wait."""

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "API call failed, retrying",
            extra={
                "call": what,
                "attempt": state.attempt_number,
                "wait_s": round(state.upcoming_sleep, 2),
                "error": str(error),
            },
        )

    return before_sleep


def _mapped(what: str, fn: Callable[[], _T]) -> Callable[[], _T]:
    """`fn` raising its API and transport failures as KubeError."""

    def run() -> _T:
        try:
            return fn()
        except KubeError:
            raise
        except Exception as exc:
            error = api_error(what, exc)
            if error is None:
                raise
            raise error from exc

    return run


def _options(
    what: str, policy: RetryPolicy, retry_on: Callable[[BaseException], bool]
) -> dict[str, Any]:
    """The tenacity settings of `call` and `call_async`: the last failure is raised."""
    return {
        "retry": retry_if_exception(retry_on),
        "stop": policy.stop(),
        "wait": policy.wait(),
        "before_sleep": log_retry(what),
        "reraise": True,
    }


def call(
    what: str,
    fn: Callable[[], _T],
    policy: RetryPolicy,
    retry_on: Callable[[BaseException], bool] = transient,
) -> _T:
    """`fn()`, tried again while it fails with an error `retry_on` accepts, within
    `policy`; the last failure is raised (a KubeError for API and transport failures)."""
    return Retrying(**_options(what, policy, retry_on))(_mapped(what, fn))


async def call_async(
    what: str,
    fn: Callable[[], _T],
    policy: RetryPolicy,
    retry_on: Callable[[BaseException], bool] = transient,
    executor: Executor | None = None,
) -> _T:
    """`call` from asyncio: each try of the blocking `fn` runs in `executor` (the loop's
    default when None) and the waits do not block the loop."""
    loop = asyncio.get_running_loop()
    run = _mapped(what, fn)
    async for attempt in AsyncRetrying(**_options(what, policy, retry_on)):
        with attempt:
            return await loop.run_in_executor(executor, run)
    raise AssertionError("unreachable: tenacity returns or raises")
