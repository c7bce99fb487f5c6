"""The Exporter's registry: the snapshot collector plus the Exporter's own metrics."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from lj_runtimekit.exporter.internal.metrics.families import PREFIX
from lj_runtimekit.exporter.internal.metrics.labels import LabelConfig
from lj_runtimekit.proto.pkg import protocolinfo
from lj_runtimekit.proto.pkg.featuregate import FEATURE_MINIMUMS, GateReport

ErrorSource = Literal["runtime", "kubelet", "apiserver", "annotations", "podresources"]
ERROR_SOURCES: tuple[ErrorSource, ...] = (
    "runtime",
    "kubelet",
    "apiserver",
    "annotations",
    "podresources",
)

SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
COLLECTION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


Encoder = Callable[[Collector], bytes]


@dataclass(frozen=True)
class Snapshot:
    """The families of one collection, served as they are until the next one replaces them."""

    families: tuple[Metric, ...] = field(default=())
    rendered: dict[str, bytes] = field(default_factory=dict)
    """Content type -> the families rendered in that format."""
    parts: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """Content type -> family name -> that family rendered (reused while it is unchanged)."""

    def by_name(self) -> dict[str, Metric]:
        """The families by name."""
        return {family.name: family for family in self.families}


def status_families(
    *,
    node: str,
    component_version: str,
    runtime_up: bool,
    kubelet_up: bool | None,
    gates: GateReport | None,
    last_gates: GateReport | None,
    pods_source: str | None,
    pods_count: int,
    collected_at_unix: float,
    label_config: LabelConfig,
) -> list[Metric]:
    """runtime_up, kubelet_up (None: the kubelet is not used), the `_info` metric, feature
    gates and the pods view.

    `gates` is this collection's (None when the Runtime was unreadable); `last_gates` is
    the last collection's that read the Runtime: the `_info` series keeps its labels while
    the Runtime is down, so it stays one series (empty values until the first read).
    `label_config` names the `node` label.
    """
    node_label = label_config.names(["node"])
    runtime = GaugeMetricFamily(
        PREFIX + "runtime_up",
        "1 when the last collection could read the Runtime, else 0.",
        labels=node_label,
    )
    runtime.add_metric([node], 1.0 if runtime_up else 0.0)
    kubelet = GaugeMetricFamily(
        PREFIX + "kubelet_up",
        "1 when the last collection could read the kubelet's /pods endpoint, else 0 (absent"
        " when the kubelet is not used).",
        labels=node_label,
    )
    if kubelet_up is not None:
        kubelet.add_metric([node], 1.0 if kubelet_up else 0.0)
    info = InfoMetricFamily(
        PREFIX + "exporter",
        "Exporter version, the Runtime version it last read and the gated features on for it"
        " (both kept while the Runtime is down; empty until the first read).",
        labels=node_label,
    )
    info.add_metric(
        [node],
        {
            "version": component_version,
            "runtime_version": str(last_gates.runtime_version) if last_gates else "",
            "features": ",".join(sorted(last_gates.enabled)) if last_gates else "",
        },
    )
    features = GaugeMetricFamily(
        PREFIX + "feature_enabled",
        "1 when a gated feature is on for the node's Runtime version, else 0 (absent while the"
        " Runtime version is unknown).",
        labels=label_config.names(["node", "feature"]),
    )
    if gates is not None:
        for feature in sorted(FEATURE_MINIMUMS):
            features.add_metric([node, str(feature)], 1.0 if feature in gates.enabled else 0.0)
    pods = GaugeMetricFamily(
        PREFIX + "exporter_pods",
        "Pods of the node in the last pods view, by source (kubelet or apiserver); absent when"
        " no source answered.",
        labels=label_config.names(["node", "source"]),
    )
    if pods_source is not None:
        pods.add_metric([node, pods_source], pods_count)
    last = GaugeMetricFamily(
        PREFIX + "exporter_last_collection_timestamp_seconds",
        "Unix time the last collection finished.",
        unit="seconds",
    )
    if collected_at_unix:
        last.add_metric([], collected_at_unix)
    return [runtime, kubelet, info, features, pods, last]


class _Families(Collector):
    """A fixed list of families, for the encoders."""

    def __init__(self, families: tuple[Metric, ...]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        """The families."""
        return self.families


class ExporterMetrics:
    """What /metrics serves: the latest snapshot, rendered once, plus the Exporter's own metrics.

    A snapshot is rendered when it is published (in each text format a scraper
    has asked for so far), so a scrape costs one small render of the Exporter's
    own instruments plus a copy, whatever the size of the node.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        """The Exporter's own instruments (the snapshot is served beside them)."""
        self._lock = threading.Lock()
        self._snapshot = Snapshot()
        self._encoders: dict[str, Encoder] = {}
        # The standard `process_*` names (RSS, CPU, fds, start time), as every Prometheus
        # client library exports them.
        ProcessCollector(registry=self.registry)
        self.scrape_duration = Histogram(
            PREFIX + "exporter_scrape_duration_seconds",
            "Time to render /metrics.",
            buckets=SCRAPE_BUCKETS,
            unit="seconds",
            registry=self.registry,
        )
        self.collection_duration = Histogram(
            PREFIX + "exporter_collection_duration_seconds",
            "Time of one background collection (Runtime and pods read concurrently).",
            buckets=COLLECTION_BUCKETS,
            unit="seconds",
            registry=self.registry,
        )
        self.collection_errors = Counter(
            PREFIX + "exporter_collection_errors",
            "Failed reads during collection, by source (runtime, kubelet, apiserver,"
            " annotations: one per pod with a malformed assignment annotation, podresources:"
            " the kubelet's PodResources API, read while the Runtime holds DRA claims).",
            ["source"],
            registry=self.registry,
        )
        for source in ERROR_SOURCES:
            self.collection_errors.labels(source)
        self.protocol = Gauge(
            protocolinfo.METRIC, protocolinfo.METRIC_HELP, ["sha256"], registry=self.registry
        )
        """1 labelled with the loaded protocol's hash (`deploy-all.sh verify` reads it)."""
        _, plain = choose_encoder("")
        self._encoders[plain] = generate_latest

    def publish(self, families: Iterable[Metric]) -> None:
        """Replace the served snapshot, rendered in every format asked for so far.

        A family equal to the previous snapshot's (inventory, allocation, error
        counters between changes) reuses its rendered text.
        """
        snapshot = Snapshot(tuple(families))
        previous = self._snapshot
        unchanged = previous.by_name()
        with self._lock:
            encoders = dict(self._encoders)
        for content_type, encoder in encoders.items():
            snapshot.rendered[content_type] = _render_snapshot(
                encoder, content_type, snapshot, previous.parts.get(content_type, {}), unchanged
            )
        self._snapshot = snapshot

    def render(self, accept: str) -> tuple[bytes, str]:
        """The /metrics body for an Accept header, and its content type."""
        encoder, content_type = choose_encoder(accept)
        snapshot = self._snapshot
        body = snapshot.rendered.get(content_type)
        if body is None:
            with self._lock:
                if len(self._encoders) < _MAX_FORMATS:
                    self._encoders.setdefault(content_type, encoder)
                body = _render_snapshot(encoder, content_type, snapshot, {}, {})
                snapshot.rendered[content_type] = body
        return body + encoder(self.registry), content_type

    def error(self, source: ErrorSource, count: int = 1) -> None:
        """Count failed reads of `source`."""
        self.collection_errors.labels(source).inc(count)


_MAX_FORMATS = 4
_EOF = b"# EOF\n"


def _render_snapshot(
    encoder: Encoder,
    content_type: str,
    snapshot: Snapshot,
    old_parts: dict[str, bytes],
    old_families: dict[str, Metric],
) -> bytes:
    parts: dict[str, bytes] = {}
    for family in snapshot.families:
        body = old_parts.get(family.name)
        if body is None or old_families.get(family.name) != family:
            body = _render(encoder, content_type, family)
        parts[family.name] = body
    snapshot.parts[content_type] = parts
    return b"".join(parts.values())


def _render(encoder: Encoder, content_type: str, family: Metric) -> bytes:
    body = encoder(_Families((family,)))
    # OpenMetrics ends with one `# EOF`: the Exporter's own part, rendered last, carries it.
    if content_type.startswith("application/openmetrics-text") and body.endswith(_EOF):
        body = body[: -len(_EOF)]
    return body
