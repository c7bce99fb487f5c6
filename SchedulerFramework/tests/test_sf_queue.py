"""Scheduling queue: priority order, backoff, unschedulable pods moved by cluster events."""

from __future__ import annotations

import time

from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    PodInfo,
    parse_pod,
)
from lj_runtimekit.schedulerframework.internal.queue.queue import SchedulingQueue


def pod(name: str, priority: int = 0) -> PodInfo:
    return parse_pod(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"priority": priority, "containers": []},
        }
    )


def test_priority_then_fifo() -> None:
    q = SchedulingQueue()
    for name, prio in (("low", 0), ("high", 10), ("low2", 0)):
        q.add(pod(name, prio))
    popped = [q.pop(0) for _ in range(3)]
    order = [qp.pod.name for qp in popped if qp is not None]
    assert order == ["high", "low", "low2"]
    assert q.pop(0) is None


def test_unschedulable_waits_for_an_event_then_backs_off() -> None:
    q = SchedulingQueue(initial_backoff_s=0.2, max_backoff_s=0.4)
    q.add(pod("a"))
    qp = q.pop(0)
    assert qp is not None
    q.add_unschedulable(qp)
    assert q.counts()["unschedulable"] == 1
    assert q.pop(0.05) is None  # nothing changed: it stays parked
    q.move_all_to_active_or_backoff()
    assert q.counts()["backoff"] == 1
    began = time.monotonic()
    again = q.pop(2)
    assert again is not None
    assert 0.1 < time.monotonic() - began < 1.5
    assert again.attempts == 2


def test_event_during_the_cycle_sends_the_pod_to_backoff() -> None:
    q = SchedulingQueue(initial_backoff_s=0.05)
    q.add(pod("a"))
    qp = q.pop(0)
    assert qp is not None
    q.move_all_to_active_or_backoff()  # e.g. a node was added while "a" was being scheduled
    q.add_unschedulable(qp)
    assert q.counts()["backoff"] == 1


def test_moving_some_pods_leaves_the_others_parked() -> None:
    q = SchedulingQueue(initial_backoff_s=30, max_backoff_s=30)
    for name in ("turned-away", "other", "in-flight"):
        q.add(pod(name))
    for _ in range(2):
        qp = q.pop(0)
        assert qp is not None
        q.add_unschedulable(qp)
    busy = q.pop(0)
    assert busy is not None
    q.move_to_active_or_backoff(["turned-away", "in-flight"])
    assert q.counts() == {"active": 0, "backoff": 1, "unschedulable": 1, "in_flight": 1}
    q.add_unschedulable(busy)  # failed in the cycle the move came in: backoff, not parked
    assert q.counts() == {"active": 0, "backoff": 2, "unschedulable": 1, "in_flight": 0}


def test_pod_update_retries_at_once_and_delete_forgets() -> None:
    q = SchedulingQueue(initial_backoff_s=5)
    q.add(pod("a"))
    qp = q.pop(0)
    assert qp is not None
    q.add_unschedulable(qp)
    changed = pod("a", priority=5)
    q.add(changed)
    assert q.pop(0) is not None
    q.delete("a")
    assert not q.has("a")


def test_claims_made_from_templates_retry_the_pod_at_once() -> None:
    q = SchedulingQueue(initial_backoff_s=5)
    q.add(pod("a"))
    qp = q.pop(0)
    assert qp is not None
    q.add_unschedulable(qp)  # waiting for the claim made from its template
    status_only = pod("a")
    status_only.obj["status"] = {"phase": "Pending"}
    q.add(status_only)
    assert q.pop(0) is None  # a status change that names no claim helps nothing
    named = pod("a")
    named.obj["status"] = {"resourceClaimStatuses": [{"name": "g", "resourceClaimName": "a-g"}]}
    q.add(named)
    assert q.pop(0) is not None
