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
    wait_for(lambda: w._queues[0].qsize() == 1, 5, "the pending items dropped")
    release.set()
    stopper.join(5)
    assert written == [0]


def test_items_of_one_key_keep_their_order_while_other_keys_go_on() -> None:
    release = threading.Event()
    written: list[tuple[str, int]] = []

    def write(item: tuple[str, int]) -> None:
        if item == ("slow", 0):
            release.wait(5)  # the API server is slow for this pod
        written.append(item)

    w: Worker[tuple[str, int]] = Worker(
        "test-writer", write, lambda i, exc: None, threads=4, key=lambda item: item[0]
    )
    slow = [("slow", i) for i in range(3)]
    others = [(f"pod-{k}", i) for k in range(6) for i in range(2)]
    for item in (*slow, *others):
        w.put(item)
    fast = [item for item in others if hash(item[0]) % 4 != hash("slow") % 4]
    wait_for(lambda: all(item in written for item in fast), 5, "the other keys written")
    assert not any(item in written for item in slow)  # held behind its own first item
    release.set()
    w.stop()
    assert [item for item in written if item[0] == "slow"] == slow
    for k in range(6):
        assert [i for key, i in written if key == f"pod-{k}"] == [0, 1]
