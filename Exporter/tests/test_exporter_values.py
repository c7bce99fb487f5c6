"""The Exporter against the Runtime simulator and a kubelet /pods endpoint: every value it
serves is what the Runtime reported (checked against a twin simulator with the same seed,
node and allocations), output passes `promtool check metrics`, and a real Prometheus
scrapes it and answers PromQL (including every query of the Grafana dashboard)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as text_string_to_metric_families_om,
)

from lj_runtimekit.exporter.internal.metrics.families import unit_of
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

GIB = 2**30
XID_DEVICE = 5


@dataclass
class Bed:
    """A simulator, the exporter reading it once, and what the Runtime reported."""

    exporter: Any
    kubelet: Any
    devices: list[pb.Device]
    expected: pb.GetDeviceMetricsResponse
    expected_containers: pb.GetContainerMetricsResponse
    scrape: Any
    pods: dict[str, Any]
    mig: pb.MigInstance


@pytest.fixture(scope="module")
def bed(lj: Any) -> Iterator[Bed]:
    base = lj.short_dir()
    node = EXAMPLE_NODES / "mig-8gpu.yaml"
    with (
        SimulatorProcess(base / "a", node) as sim,
        SimulatorProcess(base / "b", node) as twin,
    ):
        devices = lj.allocate(sim.socket_dir, [])
        mig = devices[7].mig_instances[0]
        pods = {
            "train": lj.PodSpec("uid-a", "team-a", "train-0", ("main",), {}),
            "share": lj.PodSpec("uid-b", "team-a", "share-1", ("c1", "c2"), {}),
            "mig": lj.PodSpec("uid-c", "team-b", "mig-2", ("worker",), {}),
            "done": lj.PodSpec("uid-d", "team-b", "done-3", ("x",), {}, phase="Succeeded"),
            "bad": lj.PodSpec("uid-e", "team-b", "bad-4", ("y",), {}),
        }
        D = lj.DeviceShare
        allocated = [
            lj.Grant(pods["train"], "main", D(devices[0].id)),
            lj.Grant(pods["mig"], "worker", D(mig.id)),
        ]
        assigned = [
            lj.Grant(pods["share"], "c1", D(devices[1].id, 30, 25)),
            lj.Grant(pods["share"], "c2", D(devices[1].id, 50, 50)),
        ]
        for socket_dir in (sim.socket_dir, twin.socket_dir):
            lj.allocate(socket_dir, allocated + assigned)
        lj.annotate(allocated, lj.PROTOCOL.annotations.allocated_devices)
        # The share pod was only scheduled: the scheduler's annotation is what counts.
        lj.annotate(assigned, lj.PROTOCOL.annotations.assigned_devices)
        # A finished pod holds nothing; a malformed annotation is counted and ignored.
        lj.annotate(
            [lj.Grant(pods["done"], "x", D(devices[2].id))],
            lj.PROTOCOL.annotations.allocated_devices,
        )
        pods["bad"].annotations[lj.PROTOCOL.annotations.allocated_devices] = "{not json"
        # An XID fault on a free GPU: its code is a label (and the dashboard shows it).
        for simulator in (sim, twin):
            simulator.set_health(devices[XID_DEVICE].id, healthy=False, reason="XID 79")

        kubelet = lj.kubelet_pods(list(pods.values()))
        exporter = lj.ExporterProcess(
            [
                "--runtime-socket-dir",
                str(sim.socket_dir),
                "--kubelet-pods-url",
                kubelet.url,
                # One collection only: the twin's first sample is the exporter's.
                "--collection-interval",
                "3600",
            ],
            base,
        )
        try:
            scrape = exporter.wait_scrape(
                "the first collection",
                lambda s: (
                    s.select("lj_runtimekit_runtime_up", node="node-a")
                    and s.value("lj_runtimekit_runtime_up") == 1
                ),
            )
            expected, expected_containers = lj.runtime_samples(twin.socket_dir)
            yield Bed(exporter, kubelet, devices, expected, expected_containers, scrape, pods, mig)
        finally:
            exporter.stop()
            kubelet.stop()


def _device_labels(device: pb.Device) -> dict[str, str]:
    return {
        "node": "node-a",
        "device": str(device.index),
        "uuid": device.id,
        "model": device.model,
        "kind": "gpu",
    }


def test_device_series_match_the_runtime(bed: Bed) -> None:
    s = bed.scrape
    samples = {m.device_id: m for m in bed.expected.devices}
    assert len(s.select("lj_runtimekit_device_info")) == 8
    for device in bed.devices:
        labels = _device_labels(device)
        m = samples[device.id]
        assert s.value("lj_runtimekit_device_utilization_ratio", **labels) == m.utilization_ratio
        assert s.value("lj_runtimekit_device_memory_used_bytes", **labels) == m.memory_used_bytes
        assert s.value("lj_runtimekit_device_memory_total_bytes", **labels) == 80 * GIB
        assert (
            s.value("lj_runtimekit_device_temperature_celsius", **labels) == m.temperature_celsius
        )
        assert s.value("lj_runtimekit_device_power_watts", **labels) == m.power_watts
        assert s.value("lj_runtimekit_device_energy_joules_total", **labels) == m.energy_joules
        xids = s.select("lj_runtimekit_device_xid_errors_total", **labels)
        assert sum(value for _, value in xids) == m.xid_errors
        assert (
            s.value("lj_runtimekit_device_ecc_errors_total", type="corrected", **labels)
            == m.ecc_corrected_errors
        )
        healthy = 0 if device.index == XID_DEVICE else 1
        assert s.value("lj_runtimekit_device_healthy", **labels) == healthy
        mode = "mig" if device.index >= 6 else "tdm"
        assert s.value("lj_runtimekit_device_mode", mode=mode, **labels) == 1
        assert s.value("lj_runtimekit_device_mode", mode="exclusive", **labels) == 0
        info = s.select("lj_runtimekit_device_info", **labels)[0][0]
        assert info["pci_bus_id"] == device.pci_bus_id
        assert info["resource"] == "alibabacloud.com/gpu"
    xids = s.select("lj_runtimekit_device_xid_errors_total", device=str(XID_DEVICE))
    assert {labels["xid"]: value for labels, value in xids} == {"": 0, "79": 1}


def test_mig_series_carry_profile_and_instance_id(bed: Bed) -> None:
    s = bed.scrape
    samples = {mig.instance_id: mig for d in bed.expected.devices for mig in d.mig_instances}
    series = s.select("lj_runtimekit_mig_utilization_ratio")
    assert len(series) == 9  # 7 x 1g.10gb on GPU 6, 3g.40gb + 4g.40gb on GPU 7
    for device in bed.devices[6:]:
        for instance in device.mig_instances:
            labels = {
                **_device_labels(device),
                "mig_profile": instance.profile,
                "mig_instance_id": str(instance.instance_id),
            }
            m = samples[instance.id]
            assert s.value("lj_runtimekit_mig_utilization_ratio", **labels) == m.utilization_ratio
            assert s.value("lj_runtimekit_mig_memory_used_bytes", **labels) == m.memory_used_bytes
            total = instance.memory_bytes
            assert s.value("lj_runtimekit_mig_memory_total_bytes", **labels) == total
            assert s.value("lj_runtimekit_mig_healthy", **labels) == 1
            info = s.select("lj_runtimekit_mig_info", **labels)[0][0]
            assert info["mig_uuid"] == instance.id
            assert info["resource"] == f"alibabacloud.com/mig-{instance.profile}"
    labels = {"device": "7", "mig_profile": "3g.40gb"}
    assert s.value("lj_runtimekit_mig_allocated_containers", **labels) == 1
    assert s.value("lj_runtimekit_mig_memory_total_bytes", **labels) == 40 * GIB


def test_container_series_match_the_runtime(bed: Bed) -> None:
    s = bed.scrape
    by_uid = {p.uid: p for p in bed.pods.values()}
    places: dict[str, tuple[pb.Device, pb.MigInstance | None]] = {
        d.id: (d, None) for d in bed.devices
    }
    places |= {i.id: (d, i) for d in bed.devices for i in d.mig_instances}
    expected = bed.expected_containers.containers
    assert len(expected) == 4
    assert len(s.select("lj_runtimekit_container_utilization_ratio")) == 4
    for sample in expected:
        uid, _, container = sample.container_key.partition("/")
        pod = by_uid[uid]
        device, instance = places[sample.device_id]
        labels = {
            "node": "node-a",
            "namespace": pod.namespace,
            "pod": pod.name,
            "container": container,
            "device": str(device.index),
            "uuid": device.id,
        }
        if instance is not None:
            labels["mig_profile"] = instance.profile
            labels["mig_instance_id"] = str(instance.instance_id)
        assert sample.utilization_ratio > 0
        assert (
            s.value("lj_runtimekit_container_utilization_ratio", **labels)
            == sample.utilization_ratio
        )
        assert (
            s.value("lj_runtimekit_container_memory_used_bytes", **labels)
            == sample.memory_used_bytes
        )
    mig = s.select("lj_runtimekit_container_memory_used_bytes", pod="mig-2")[0][0]
    assert (mig["device"], mig["mig_profile"]) == ("7", "3g.40gb")


def test_mig_container_series_name_the_instance_they_are_relative_to(bed: Bed) -> None:
    """A container on a MIG instance reports the Runtime's number, a share of that instance
    (its labels name it; HELP says so); a container on a whole device or a slice has empty
    MIG labels and a share of the device."""
    s = bed.scrape
    instance = bed.mig
    (labels, used), *others = s.select("lj_runtimekit_container_utilization_ratio", pod="mig-2")
    assert others == []
    assert (labels["uuid"], labels["mig_profile"], labels["mig_instance_id"]) == (
        bed.devices[7].id,
        instance.profile,
        str(instance.instance_id),
    )
    # The only container on the instance: the instance's utilization is its share plus
    # idle noise, so the share is relative to the instance (3/7 of the GPU), not the GPU.
    instance_util = s.value(
        "lj_runtimekit_mig_utilization_ratio",
        uuid=labels["uuid"],
        mig_instance_id=labels["mig_instance_id"],
    )
    assert used <= instance_util < used + 0.05
    relative = "MIG instance (mig_profile and mig_instance_id set) that instance"
    for name in ("utilization_ratio", "core_allocated_ratio", "memory_allocated_ratio"):
        assert relative in s.help[f"lj_runtimekit_container_{name}"]
    for labels, _ in s.select("lj_runtimekit_container_utilization_ratio", pod="share-1"):
        assert (labels["mig_profile"], labels["mig_instance_id"]) == ("", "")


def test_allocation_series_from_pod_annotations(bed: Bed) -> None:
    s = bed.scrape

    def device(index: int, name: str) -> float:
        return float(s.value(f"lj_runtimekit_device_{name}", device=str(index)))

    # Whole GPU 0; GPU 1 sliced 30 % + 50 % core, 25 % + 50 % memory (assigned only).
    assert (device(0, "core_allocated_ratio"), device(0, "memory_allocated_ratio")) == (1, 1)
    assert (device(1, "core_allocated_ratio"), device(1, "memory_allocated_ratio")) == (0.8, 0.75)
    assert device(1, "allocated_containers") == 2
    # The finished pod's GPU 2 is free; the 3g.40gb MIG instance is 3/7 of GPU 7, half its memory.
    assert device(2, "allocated_containers") == 0
    assert device(2, "core_allocated_ratio") == 0
    assert device(7, "core_allocated_ratio") == pytest.approx(3 / 7, abs=1e-6)
    assert device(7, "memory_allocated_ratio") == 0.5
    labels = {"pod": "share-1", "container": "c1", "device": "1"}
    assert s.value("lj_runtimekit_container_core_allocated_ratio", **labels) == 0.3
    assert s.value("lj_runtimekit_container_memory_allocated_ratio", **labels) == 0.25
    assert s.value("lj_runtimekit_container_core_allocated_ratio", pod="train-0") == 1
    assert s.select("lj_runtimekit_container_core_allocated_ratio", pod="done-3") == []
    assert s.value("lj_runtimekit_exporter_collection_errors_total", source="annotations") == 1


def test_status_series(bed: Bed) -> None:
    s = bed.scrape
    assert s.value("lj_runtimekit_kubelet_up", node="node-a") == 1
    assert s.value("lj_runtimekit_exporter_pods", source="kubelet") == 5
    info = s.select("lj_runtimekit_exporter_info", node="node-a")[0][0]
    assert info["runtime_version"] == "v1.14.0"
    assert info["version"].startswith("v1.")
    assert info["features"] == "container-metrics,mig,ppu-amd-devices"
    assert s.value("lj_runtimekit_feature_enabled", feature="topology-gang") == 0
    assert s.value("lj_runtimekit_feature_enabled", feature="container-metrics") == 1
    assert s.value("lj_runtimekit_exporter_collection_errors_total", source="runtime") == 0
    assert s.value("lj_runtimekit_exporter_collection_duration_seconds_count") == 1
    # prometheus_client's process collector under the standard names, nothing hand-made.
    assert s.value("process_resident_memory_bytes") > 0
    assert s.value("process_cpu_seconds_total") > 0
    assert not any("_process_" in name for name in s.names())
    assert all(name.startswith(("lj_runtimekit_", "process_")) for name in s.names())


def test_http_gzip_healthz_and_not_found(bed: Bed) -> None:
    status, body, headers = bed.exporter.get("/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert body[:2] == b"\x1f\x8b"
    status, body, _ = bed.exporter.get("/healthz")
    assert (status, body.startswith(b"ok")) == (200, True)
    status, _, _ = bed.exporter.get("/nope")
    assert status == 404


def test_openmetrics_for_scrapers_that_ask(bed: Bed) -> None:
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, body, headers = bed.exporter.get("/metrics", {"Accept": accept})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    assert text.count("# EOF") == 1
    parsed = text_string_to_metric_families_om(text)  # type: ignore[no-untyped-call]
    families = {f.name: f for f in parsed}
    assert families["lj_runtimekit_device_energy_joules"].type == "counter"
    assert families["lj_runtimekit_exporter"].type == "info"
    assert len(families["lj_runtimekit_container_utilization_ratio"].samples) == 4
    # Units on every family named with one, under the names the 0.0.4 format serves.
    expected_units = {
        "lj_runtimekit_device_memory_used_bytes": "bytes",
        "lj_runtimekit_device_utilization_ratio": "ratio",
        "lj_runtimekit_device_temperature_celsius": "celsius",
        "lj_runtimekit_device_power_watts": "watts",
        "lj_runtimekit_device_energy_joules": "joules",
        "lj_runtimekit_mig_memory_total_bytes": "bytes",
        "lj_runtimekit_container_core_allocated_ratio": "ratio",
        "lj_runtimekit_exporter_collection_duration_seconds": "seconds",
        "lj_runtimekit_exporter_scrape_duration_seconds": "seconds",
        "lj_runtimekit_exporter_last_collection_timestamp_seconds": "seconds",
        "process_resident_memory_bytes": "",
    }
    assert {name: families[name].unit for name in expected_units} == expected_units
    for name, family in families.items():
        if name.startswith("lj_runtimekit_"):
            assert family.unit == unit_of(name), name
    assert "# UNIT lj_runtimekit_device_power_watts watts\n" in text
    served = {s.name for f in families.values() for s in f.samples}
    assert served == bed.exporter.scrape().names()
    after = bed.exporter.scrape()
    assert after.value("lj_runtimekit_exporter_scrape_duration_seconds_count") >= 2


def test_promtool_check_metrics_passes(bed: Bed, lj: Any) -> None:
    promtool = lj.require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=bed.exporter.scrape().text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""  # no lint warnings either


def test_alert_rules_use_only_served_metrics(bed: Bed, lj: Any) -> None:
    rules_file = lj.REPO / "deploy" / "exporter" / "monitoring" / "alerts.yaml"
    rules = yaml.safe_load(rules_file.read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    used = {name for expr in exprs for name in _METRIC.findall(expr)}
    assert "lj_runtimekit_device_healthy" in used
    assert used <= bed.scrape.names(), used - bed.scrape.names()


# --- a real Prometheus ------------------------------------------------------------------


class Prometheus:
    """A Prometheus server on loopback scraping the exporter every second."""

    def __init__(self, binary: str, target_port: int, work: Path, lj: Any) -> None:
        self.port = lj.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = work / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: lj-exporter\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n"
        )
        self.log_path = work / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except urllib.error.HTTPError as exc:  # 503 while it starts
                exc.close()
                return False

        lj.wait_for(ready, 60, "prometheus to be ready", ignore=lj.PROBE_ERRORS)

    def query(self, expr: str) -> dict[str, Any]:
        """Instant query through the HTTP API; the decoded JSON answer."""
        return self.api("query", query=expr)

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET /api/v1/<path>?<params>; the decoded JSON answer."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer: dict[str, Any] = json.load(r)
        except urllib.error.HTTPError as exc:
            with exc:
                answer = json.load(exc)
        return answer

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def prometheus(bed: Bed, lj: Any) -> Iterator[Prometheus]:
    binary = lj.require_tool("prometheus")
    server = Prometheus(binary, bed.exporter.port, lj.short_dir("ljprom"), lj)
    yield server
    server.stop()


def _vector(prom: Prometheus, expr: str, lj: Any, timeout: float = 60.0) -> list[Any]:
    def probe() -> list[Any] | None:
        answer = prom.query(expr)
        assert answer["status"] == "success", f"{expr}: {answer}"
        result: list[Any] = answer["data"]["result"]
        return result or None

    found: list[Any] = lj.wait_for(
        probe, timeout, f"PromQL {expr} to return data", ignore=lj.PROBE_ERRORS
    )
    return found


def test_prometheus_scrapes_and_promql_returns_the_pod_value(
    bed: Bed, prometheus: Prometheus, lj: Any
) -> None:
    by_key = {c.container_key: c for c in bed.expected_containers.containers}
    c1, c2 = by_key["uid-b/c1"], by_key["uid-b/c2"]
    result = _vector(
        prometheus,
        'lj_runtimekit_container_memory_used_bytes{namespace="team-a",pod="share-1",container="c1"}',
        lj,
    )
    assert len(result) == 1
    assert float(result[0]["value"][1]) == c1.memory_used_bytes
    result = _vector(
        prometheus,
        'sum by (namespace, pod) (lj_runtimekit_container_utilization_ratio{pod="share-1"})',
        lj,
    )
    assert result[0]["metric"] == {"namespace": "team-a", "pod": "share-1"}
    assert float(result[0]["value"][1]) == pytest.approx(
        c1.utilization_ratio + c2.utilization_ratio, abs=1e-9
    )
    up = _vector(prometheus, 'up{job="lj-exporter"}', lj)
    assert float(up[0]["value"][1]) == 1


def test_prometheus_keeps_the_units_it_scraped(bed: Bed, prometheus: Prometheus, lj: Any) -> None:
    _vector(prometheus, "lj_runtimekit_device_power_watts", lj)
    units = {}
    for name in (
        "lj_runtimekit_device_power_watts",
        "lj_runtimekit_container_memory_used_bytes",
        "lj_runtimekit_exporter_collection_duration_seconds",
    ):
        answer = prometheus.api("targets/metadata", match_target='{job="lj-exporter"}', metric=name)
        assert answer["status"] == "success", answer
        (entry,) = answer["data"]
        units[name] = entry["unit"]
    assert units == {
        "lj_runtimekit_device_power_watts": "watts",
        "lj_runtimekit_container_memory_used_bytes": "bytes",
        "lj_runtimekit_exporter_collection_duration_seconds": "seconds",
    }


_METRIC = re.compile(r"\b(?:lj_runtimekit|process)_[a-z0-9_]+")
_VARIABLES = {"$node": ".*", "$namespace": ".*", "$pod": ".*", "$__rate_interval": "1m"}
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_GROUPING = re.compile(r"\b(?:by|group_left|group_right)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\((.+), *(\w+)\)")


@dataclass(frozen=True)
class _Query:
    """One dashboard query: where it is, its PromQL, the labels its panel reads."""

    where: str
    expr: str
    grouped_by: frozenset[str]
    """Labels of `by (...)`, `group_left (...)`, `group_right (...)`: on every result series."""
    shown: frozenset[str]
    """Labels of the legend (or a variable's label): on some result series."""


def _dashboard_queries(path: Path) -> list[_Query]:
    dashboard = json.loads(path.read_text())
    queries: list[_Query] = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            grouped = {
                label.strip()
                for labels in _GROUPING.findall(expr)
                for label in labels.split(",")
                if label.strip()
            }
            # histogram_quantile consumes `le`.
            if "histogram_quantile" in expr:
                grouped.discard("le")
            queries.append(
                _Query(
                    f"panel {panel['title']!r} {target['refId']}",
                    expr,
                    frozenset(grouped),
                    frozenset(_LEGEND_LABEL.findall(target.get("legendFormat", ""))),
                )
            )
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            match = _LABEL_VALUES.fullmatch(query["query"])
            assert match, f"variable {variable['name']}: not label_values(...): {query}"
            queries.append(
                _Query(
                    f"variable {variable['name']!r}",
                    match.group(1),
                    frozenset(),
                    frozenset({match.group(2)}),
                )
            )
    return queries


def test_dashboard_queries_use_real_metrics_and_return_data(
    bed: Bed, prometheus: Prometheus, lj: Any
) -> None:
    """Every panel and variable query is valid PromQL over metrics the exporter serves,
    returns data from a real Prometheus scraping it, and every label the panel reads (its
    legend's `{{label}}`, `by (...)`, `group_left (...)`) is on the result."""
    queries = _dashboard_queries(lj.DASHBOARD)
    assert len(queries) >= 20
    served = bed.exporter.scrape().names()
    for query in queries:
        names = set(_METRIC.findall(query.expr))
        assert names, f"{query.where} uses no exporter metric: {query.expr}"
        missing = names - served
        assert not missing, f"{query.where} uses metrics not served: {missing}"
    for query in queries:
        expr = query.expr
        for name, value in _VARIABLES.items():
            expr = expr.replace(name, value)
        result = _vector(prometheus, expr, lj)
        labels = [set(series["metric"]) for series in result]
        for label in query.grouped_by:
            lacking = [series for series in labels if label not in series]
            assert not lacking, f"{query.where}: {label!r} missing from {lacking}: {expr}"
        for label in query.shown:
            assert any(label in series for series in labels), (
                f"{query.where}: no result series has {label!r} ({labels}): {expr}"
            )


_SHARES = re.compile(
    r"lj_runtimekit_container_(?:utilization|core_allocated|memory_allocated)_ratio\{([^}]*)\}"
)
_AGGREGATION = re.compile(r"\b(?:sum|avg|min|max)\b")


def test_dashboard_keeps_mig_shares_apart_from_device_shares(lj: Any) -> None:
    """A container's ratios on a MIG instance are shares of that instance: a dashboard query
    aggregating container ratios filters on mig_instance_id or keeps it as a group, so it
    never adds shares of an instance to shares of a device."""
    checked = 0
    for query in _dashboard_queries(lj.DASHBOARD):
        if not _AGGREGATION.search(query.expr):
            continue
        for selector in _SHARES.findall(query.expr):
            checked += 1
            assert "mig_instance_id" in selector or "mig_instance_id" in query.grouped_by, (
                f"{query.where} adds MIG instance shares to device shares: {query.expr}"
            )
    assert checked >= 2
