"""The Controller's Prometheus metrics, read at scrape time from the counters the reconciler,
the Job recorder and the work queue already keep (no second bookkeeping)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
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


def exposition(counts: Callable[[], Counts]) -> Callable[[], bytes]:
    """A function that renders the metrics in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(counts))
    return lambda: generate_latest(registry)
