"""Bounded retries of API calls (pure: the failures are raised by the call itself)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client.exceptions import ApiException

from lj_runtimekit.proto.pkg.kube import (
    KubeError,
    NotFoundError,
    RetryPolicy,
    call,
    call_async,
    kube_error,
)

FAST = RetryPolicy(attempts=4, timeout_s=None, initial_s=0.0, max_backoff_s=0.0, jitter_s=0.0)


class Flaky:
    """Fails with `errors` in turn, then answers `done`."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_transient_failures_are_retried_and_each_retry_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fn = Flaky(kube_error("GET /x", 503, "busy"), ConnectionResetError("reset"))
    with caplog.at_level(logging.WARNING, "lj_runtimekit.proto.pkg.kube.retry"):
        assert call("read x", fn, FAST) == "done"
    assert fn.calls == 3
    retries = [r for r in caplog.records if r.getMessage() == "API call failed, retrying"]
    assert [(r.call, r.attempt) for r in retries] == [("read x", 1), ("read x", 2)]  # type: ignore[attr-defined]
    assert retries[1].error == "read x: no answer: reset"  # type: ignore[attr-defined]


def test_attempts_bound_the_retries_and_the_last_error_is_raised() -> None:
    fn = Flaky(*(kube_error("GET /x", 500, f"failure {i}") for i in range(10)))
    with pytest.raises(KubeError, match="failure 3"):
        call("read x", fn, FAST)
    assert fn.calls == 4


def test_time_bounds_the_retries() -> None:
    policy = RetryPolicy(
        attempts=None, timeout_s=0.3, initial_s=0.05, max_backoff_s=0.05, jitter_s=0.0
    )
    fn = Flaky(*(kube_error("GET /x", 429, "slow down") for _ in range(1000)))
    start = time.monotonic()
    with pytest.raises(KubeError, match="slow down"):
        call("read x", fn, policy)
    assert 0.3 <= time.monotonic() - start < 2.0
    assert 3 <= fn.calls < 20


def test_a_final_answer_is_raised_at_once_mapped() -> None:
    missing = ApiException(status=404, reason="Not Found")
    missing.body = b'{"kind": "Status", "message": "nodes \\"a\\" not found", "reason": "NotFound"}'
    fn = Flaky(missing)
    with pytest.raises(NotFoundError) as caught:
        call("read node a", fn, FAST)
    assert str(caught.value) == 'read node a: HTTP 404: nodes "a" not found'
    assert fn.calls == 1


def test_a_bug_is_neither_retried_nor_mapped() -> None:
    fn = Flaky(KeyError("metadata"))
    with pytest.raises(KeyError):
        call("read x", fn, FAST)
    assert fn.calls == 1


def test_retry_on_chooses_what_is_retried() -> None:
    fn = Flaky(kube_error("GET /x", 404, "not yet"))
    assert call("read x", fn, FAST, retry_on=lambda exc: isinstance(exc, NotFoundError)) == "done"
    assert fn.calls == 2


async def test_call_async_runs_each_try_in_the_executor() -> None:
    import threading

    threads: list[str] = []
    fn = Flaky(kube_error("GET /x", 502, "bad gateway"))

    def tracked() -> str:
        threads.append(threading.current_thread().name)
        return fn()

    with ThreadPoolExecutor(1, thread_name_prefix="kube-test") as pool:
        assert await call_async("read x", tracked, FAST, executor=pool) == "done"
    assert len(threads) == 2
    assert all(t.startswith("kube-test") for t in threads)
    fn = Flaky(kube_error("GET /x", 403, "forbidden"))
    with pytest.raises(KubeError, match="forbidden"):
        await call_async("read x", fn, FAST)
    assert fn.calls == 1
