"""The Controller's Prometheus metrics: counts read at scrape time from the counters the
reconciler, the Job recorder and the work queue already keep (no second bookkeeping), and
the histogram of the time from a label change to the action done."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

PREFIX = "lj_runtimekit_controller"


@dataclass(frozen=True)
class Counts:
    """What the Controller has done since it started, and its state now."""

    jobs_created: int
    jobs_succeeded: int
    jobs_failed: int
    retries: int
    reconciles: int
    reconcile_errors: int
    queue_depth: int
    leading: bool


class ControllerCollector(Collector):
    """Turns `Counts` into metric families on every scrape."""

    def __init__(self, counts: Callable[[], Counts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        c = self._counts()
        jobs = CounterMetricFamily(
            f"{PREFIX}_jobs", "Enable/disable Jobs by what happened to them.", labels=["event"]
        )
        jobs.add_metric(["created"], c.jobs_created)
        jobs.add_metric(["succeeded"], c.jobs_succeeded)
        jobs.add_metric(["failed"], c.jobs_failed)
        yield jobs
        yield CounterMetricFamily(
            f"{PREFIX}_retries", "Failed actions retried after their backoff.", value=c.retries
        )
        reconciles = CounterMetricFamily(
            f"{PREFIX}_reconciles", "Node reconciles by result.", labels=["result"]
        )
        reconciles.add_metric(["ok"], c.reconciles)
        reconciles.add_metric(["error"], c.reconcile_errors)
        yield reconciles
        yield GaugeMetricFamily(
            f"{PREFIX}_workqueue_depth",
            "Nodes queued, being reconciled or waiting for a delayed retry.",
            value=c.queue_depth,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_leader", "1 while this replica leads and watches.", value=int(c.leading)
        )


LABEL_TO_DONE_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Seconds: a Job on an idle cluster takes a few, retries with backoff minutes."""


class LabelToDone:
    """Seconds from a node's label change, as this process saw it, to its action done:
    `succeeded` (state enabled/disabled) or `failed` (for good: permanent, or no retry
    left). A failure that will be retried is not done; the time runs on. One observation
    per change: a later outcome without a new change is not counted again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.histogram = Histogram(
            f"{PREFIX}_label_to_done_seconds",
            "Seconds from a node's label change (as the Controller saw it) to its enable or"
            " disable action done, by action and outcome (succeeded, failed).",
            ["action", "outcome"],
            registry=None,
            buckets=LABEL_TO_DONE_BUCKETS,
        )
        self._clock = clock
        self._changed: dict[str, float] = {}

    def changed(self, node: str) -> None:
        """The node's label changed (or the node was first seen): the time starts."""
        self._changed[node] = self._clock()

    def done(self, node: str, action: str, outcome: str) -> None:
        """The node's action ended with `outcome`; observed once per change."""
        since = self._changed.pop(node, None)
        if since is not None:
            self.histogram.labels(action, outcome).observe(self._clock() - since)


def exposition(counts: Callable[[], Counts], *collectors: Collector) -> Callable[[], bytes]:
    """A function that renders the metrics (the counts and `collectors`) in the Prometheus
    text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(counts))
    for collector in collectors:
        registry.register(collector)
    return lambda: generate_latest(registry)
