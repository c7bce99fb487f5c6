"""A thread of its own that sends queued writes to the API server, so that the
scheduling loop never waits for them (events, preemptions)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Worker(Generic[T]):
    """Hands the items put to `write`, one at a time, on a thread named `name`; an item
    whose `write` raises goes to `failed` with the exception. With `size`, a full queue
    drops the item (counted in `dropped`) rather than block."""

    def __init__(
        self,
        name: str,
        write: Callable[[T], None],
        failed: Callable[[T, Exception], None],
        size: int = 0,
    ) -> None:
        self._write = write
        self._failed = failed
        self._queue: queue.Queue[T | None] = queue.Queue(maxsize=size)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: T) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def stop(self, drop_pending: bool = False) -> None:
        """Ends the thread once the items queued before are written (5 s at most), or
        at once after the item being written when `drop_pending`."""
        if drop_pending:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._write(item)
            except Exception as exc:
                self._failed(item, exc)
