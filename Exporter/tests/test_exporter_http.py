"""The HTTP server and the render cache, in process: each published snapshot is what every
format serves, and /healthz reports the collection loop's own verdict."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily

from lj_runtimekit.exporter.internal.metrics.registry import ExporterMetrics
from lj_runtimekit.exporter.internal.server.http import MetricsServer, make_app
from lj_runtimekit.proto.pkg import protocolinfo

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


class Health:
    def __init__(self) -> None:
        self.ok = True

    def __call__(self) -> tuple[bool, str]:
        return self.ok, "ok: fine" if self.ok else "no collection finished in the last 99 s"


@pytest.fixture
def served() -> Iterator[tuple[ExporterMetrics, Health, str]]:
    metrics, health = ExporterMetrics(), Health()
    server = MetricsServer(make_app(metrics, health), "127.0.0.1", 0)
    server.start()
    yield metrics, health, f"http://127.0.0.1:{server.port}"
    server.stop()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
            if response.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return response.status, response.headers["Content-Type"], body.decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _families(value: float) -> list[GaugeMetricFamily]:
    gauge = GaugeMetricFamily("lj_runtimekit_test_value", "A test value.", labels=["k"])
    gauge.add_metric(["a"], value)
    return [gauge]


def test_every_format_serves_the_latest_snapshot(
    served: tuple[ExporterMetrics, Health, str],
) -> None:
    metrics, _, base = served
    metrics.publish(_families(1.0))
    for headers in ({}, {"Accept": OPENMETRICS}, {"Accept-Encoding": "gzip"}):
        status, _, body = _get(base + "/metrics", headers)
        assert status == 200
        assert 'lj_runtimekit_test_value{k="a"} 1.0' in body
    # Both formats were asked for: the next snapshot is rendered in both at publish.
    metrics.publish(_families(2.0))
    _, content_type, body = _get(base + "/metrics", {"Accept": OPENMETRICS})
    assert content_type.startswith("application/openmetrics-text")
    assert 'lj_runtimekit_test_value{k="a"} 2.0' in body
    assert body.endswith("# EOF\n")
    assert body.count("# EOF") == 1
    _, content_type, body = _get(base + "/metrics")
    assert content_type.startswith("text/plain; version=0.0.4")
    assert 'lj_runtimekit_test_value{k="a"} 2.0' in body
    assert "lj_runtimekit_exporter_scrape_duration_seconds_count" in body


def test_healthz_follows_the_loop(served: tuple[ExporterMetrics, Health, str]) -> None:
    _, health, base = served
    assert _get(base + "/healthz")[::2] == (200, "ok: fine\n")
    health.ok = False
    status, _, body = _get(base + "/healthz")
    assert status == 503
    assert "no collection finished" in body
    assert _get(base + "/")[0] == 200
    assert _get(base + "/other")[0] == 404


def test_protocol_info_is_served_as_verify_reads_it(
    served: tuple[ExporterMetrics, Health, str],
) -> None:
    """The loaded protocol's hash is one of the Exporter's own metrics, in every format,
    under the name, help and label `deploy-all.sh verify` reads."""
    metrics, _, base = served
    sha = "ab" * 32
    metrics.protocol.labels(sha).set(1)
    for headers in ({}, {"Accept": OPENMETRICS}):
        _, _, body = _get(base + "/metrics", headers)
        assert protocolinfo.sha256_from_metrics(body) == sha
        assert f"# HELP {protocolinfo.METRIC} {protocolinfo.METRIC_HELP}\n" in body
