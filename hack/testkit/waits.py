"""Polling waits with a deadline: the one helper every test, benchmark and the sandbox use."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")


class WaitTimeout(TimeoutError):
    """A wait ran out; the message says what was awaited and the last state seen."""


@dataclass(frozen=True)
class NotYet:
    """A condition's answer "not yet", with what it saw (falsy; the timeout error quotes it)."""

    detail: str

    def __bool__(self) -> bool:
        return False


def _detail(value: object, describe: Callable[[], object] | None, error: str) -> str:
    if isinstance(value, NotYet):
        return value.detail
    if describe is not None:
        with contextlib.suppress(Exception):
            return str(describe())
    return error


def wait_for(
    condition: Callable[[], _T | NotYet | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.2,
    describe: Callable[[], object] | None = None,
    ignore: tuple[type[Exception], ...] = (),
) -> _T:
    """Poll `condition` until it returns a truthy value, and return that value.

    A falsy answer (or `NotYet(detail)`, or one of the `ignore` exceptions) means
    "not yet". On timeout, WaitTimeout names `what` and the last state: the
    last `NotYet` detail, else `describe()`, else the last ignored exception.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        error = ""
        try:
            value = condition()
        except ignore as exc:
            value, error = None, repr(exc)
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            detail = _detail(value, describe, error)
            suffix = f"; last state: {detail}" if detail else ""
            raise WaitTimeout(f"timed out after {timeout_s:g}s waiting for {what}{suffix}")
        time.sleep(interval_s)
