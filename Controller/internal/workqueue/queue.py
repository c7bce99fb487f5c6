"""A keyed work queue in the manner of client-go's: one pending entry per key, a key is
never processed by two workers at once, failures are retried with per-key exponential
backoff, and a reconcile may ask to be run again after a delay.

Node and Job events both enqueue the node's name, so everything about one node is
serialized here: that is what keeps "never two Jobs for one node" simple.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Requeue:
    """Run this key again after `after_s` (not an error: no backoff growth)."""

    after_s: float
    why: str = ""


Reconcile = Callable[[str], Awaitable[Requeue | None]]


class WorkQueue:
    """Deduplicating queue of keys processed by `workers` concurrent tasks."""

    def __init__(
        self,
        reconcile: Reconcile,
        workers: int,
        base_backoff_s: float = 0.5,
        max_backoff_s: float = 60.0,
    ) -> None:
        self._reconcile = reconcile
        self._workers = workers
        self._base = base_backoff_s
        self._max = max_backoff_s
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.processed = 0
        self.errors = 0

    def add(self, key: str) -> None:
        """Process `key` soon (once, however often it is added meanwhile)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._active:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: str, delay_s: float) -> None:
        """Process `key` after `delay_s` (an earlier add wins; a later delay keeps the sooner)."""
        if key in self._queued:
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay_s
        if existing is not None:
            if existing.when() <= due:
                return
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def __len__(self) -> int:
        return len(self._queued) + len(self._active) + len(self._timers)

    def pending(self) -> int:
        """Keys queued or being processed right now (not counting delayed ones)."""
        return len(self._queued) + len(self._active)

    def start(self) -> None:
        """Start the workers."""
        for i in range(self._workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"reconcile-worker-{i}"))

    async def stop(self) -> None:
        """Stop the workers (in-flight reconciles are cancelled) and drop pending timers."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    def _backoff(self, key: str) -> float:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        return float(min(self._max, self._base * 2 ** (failures - 1)))

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                result = await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                delay = self._backoff(key)
                _log.warning(
                    "reconcile failed, retrying",
                    extra={"key": key, "error": str(exc), "retry_in_s": round(delay, 2)},
                    exc_info=not isinstance(exc, RuntimeError),
                )
                self._finish(key)
                self.add_after(key, delay)
                continue
            self.processed += 1
            self._failures.pop(key, None)
            self._finish(key)
            if result is not None:
                self.add_after(key, result.after_s)

    def _finish(self, key: str) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
