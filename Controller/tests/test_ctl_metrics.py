"""The Controller's /metrics on its health port: Prometheus text format, the counts it reads."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit.controller.internal.health.server import HealthServer
from lj_runtimekit.controller.internal.metrics.metrics import Counts, LabelToDone, exposition


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.headers["Content-Type"], response.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


COUNTS = Counts(0, 0, 0, 0, 0, 0, 0, False)


async def test_metrics_are_served_in_the_prometheus_format_with_the_current_counts() -> None:
    counts = Counts(
        jobs_created=5,
        jobs_succeeded=3,
        jobs_failed=1,
        retries=2,
        reconciles=40,
        reconcile_errors=4,
        queue_depth=7,
        leading=True,
    )
    server = HealthServer("127.0.0.1", 0)
    server.metrics = exposition(lambda: counts)
    await server.start()
    try:
        content_type, text = await asyncio.to_thread(
            _get, f"http://127.0.0.1:{server.port}/metrics"
        )
    finally:
        await server.stop()
    assert content_type.startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    prefix = "lj_runtimekit_controller"
    assert samples[(f"{prefix}_jobs_total", (("event", "created"),))] == 5
    assert samples[(f"{prefix}_jobs_total", (("event", "succeeded"),))] == 3
    assert samples[(f"{prefix}_jobs_total", (("event", "failed"),))] == 1
    assert samples[(f"{prefix}_retries_total", ())] == 2
    assert samples[(f"{prefix}_reconciles_total", (("result", "error"),))] == 4
    assert samples[(f"{prefix}_workqueue_depth", ())] == 7
    assert samples[(f"{prefix}_leader", ())] == 1


async def test_without_metrics_the_path_is_not_found() -> None:
    server = HealthServer("127.0.0.1", 0)
    await server.start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics")
        try:
            await asyncio.to_thread(urllib.request.urlopen, request, timeout=5)
            status = 200
        except urllib.error.HTTPError as exc:
            exc.close()
            status = exc.code
    finally:
        await server.stop()
    assert status == 404


def test_label_to_done_is_observed_once_per_label_change_by_action_and_outcome() -> None:
    now = [100.0]
    timer = LabelToDone(clock=lambda: now[0])
    render = exposition(lambda: COUNTS, timer.histogram)
    timer.changed("a")
    timer.changed("b")
    now[0] = 112.0
    timer.done("a", "enable", "succeeded")
    timer.done("a", "enable", "succeeded")  # no new label change: not counted again
    timer.done("never-changed", "enable", "succeeded")
    now[0] = 400.0
    timer.done("b", "disable", "failed")
    samples = _samples(render().decode())
    name = "lj_runtimekit_controller_label_to_done_seconds"
    enable_ok = (("action", "enable"), ("outcome", "succeeded"))
    disable_failed = (("action", "disable"), ("outcome", "failed"))
    assert samples[(f"{name}_count", enable_ok)] == 1
    assert samples[(f"{name}_sum", enable_ok)] == 12.0
    assert samples[(f"{name}_bucket", (*enable_ok[:1], ("le", "10.0"), *enable_ok[1:]))] == 0
    assert samples[(f"{name}_bucket", (*enable_ok[:1], ("le", "20.0"), *enable_ok[1:]))] == 1
    assert samples[(f"{name}_count", disable_failed)] == 1
    assert samples[(f"{name}_sum", disable_failed)] == 300.0
