"""Threads of their own that send queued writes to the API server, so that the
scheduling loop never waits for them (events, preemptions)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Worker(Generic[T]):
    """Hands the items put to `write` on `threads` threads named after `name`: an item
    goes to the thread of its `key` (the items of one key are written one at a time, in
    the order put; with one thread, all of them). An item whose `write` raises goes to
    `failed` with the exception. With `size`, a full queue (one per thread) drops the
    item (counted in `dropped`) rather than block."""

    def __init__(
        self,
        name: str,
        write: Callable[[T], None],
        failed: Callable[[T, Exception], None],
        size: int = 0,
        threads: int = 1,
        key: Callable[[T], Hashable] | None = None,
    ) -> None:
        if threads > 1 and key is None:
            raise ValueError("a worker with several threads needs the items' key")
        self._write = write
        self._failed = failed
        self._key = key
        self._queues: list[queue.Queue[T | None]] = [
            queue.Queue(maxsize=size) for _ in range(threads)
        ]
        self.dropped = 0
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(q,),
                name=name if threads == 1 else f"{name}-{i}",
                daemon=True,
            )
            for i, q in enumerate(self._queues)
        ]
        for t in self._threads:
            t.start()

    def put(self, item: T) -> None:
        queues = self._queues
        q = queues[0] if self._key is None else queues[hash(self._key(item)) % len(queues)]
        try:
            q.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def stop(self, drop_pending: bool = False) -> None:
        """Ends the threads once the items queued before are written (5 s at most), or
        at once after the items being written when `drop_pending`."""
        for q in self._queues:
            if drop_pending:
                while True:
                    try:
                        q.get_nowait()
                    except queue.Empty:
                        break
            q.put(None)
        deadline = time.monotonic() + 5
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self, q: queue.Queue[T | None]) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            try:
                self._write(item)
            except Exception as exc:
                self._failed(item, exc)
