"""The writer thread shared by the event recorder, the evictor and the condition writer."""

from __future__ import annotations

import threading

from lj_runtimekit.schedulerframework.internal.scheduler.worker import Worker
from lj_runtimekit.testkit.waits import wait_for


def test_items_written_in_order_and_failures_handed_on() -> None:
    written: list[int] = []
    failed: list[tuple[int, str]] = []

    def write(i: int) -> None:
        if i == 2:
            raise RuntimeError("boom")
        written.append(i)

    w = Worker("test-writer", write, lambda i, exc: failed.append((i, str(exc))))
    for i in range(5):
        w.put(i)
    w.stop()  # the items queued before are written first
    assert written == [0, 1, 3, 4]
    assert failed == [(2, "boom")]


def test_a_full_queue_drops_rather_than_blocks() -> None:
    release = threading.Event()
    started = threading.Event()
    written: list[int] = []

    def write(i: int) -> None:
        started.set()
        release.wait(5)
        written.append(i)

    w = Worker("test-writer", write, lambda i, exc: None, size=2)
    w.put(0)
    wait_for(started.is_set, 5, "the first item taken")
    for i in range(1, 5):
        w.put(i)  # 1 and 2 queued, 3 and 4 dropped
    assert w.dropped == 2
    release.set()
    w.stop()
    assert written == [0, 1, 2]


def test_stop_dropping_pending_writes_only_the_item_in_hand() -> None:
    release = threading.Event()
    started = threading.Event()
    written: list[int] = []

    def write(i: int) -> None:
        started.set()
        release.wait(5)
        written.append(i)

    w = Worker("test-writer", write, lambda i, exc: None)
    for i in range(4):
        w.put(i)
    wait_for(started.is_set, 5, "the first item taken")
    stopper = threading.Thread(target=w.stop, kwargs={"drop_pending": True})
    stopper.start()
    # the three pending items dropped, only the stop mark left
    wait_for(lambda: w._queue.qsize() == 1, 5, "the pending items dropped")
    release.set()
    stopper.join(5)
    assert written == [0]
