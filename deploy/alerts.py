"""The Exporter's alerting rules: one source for `deploy/exporter/monitoring/alerts.yaml` (a
plain Prometheus rule file) and `deploy/exporter/monitoring/prometheusrule.yaml` (the same
rules as a Prometheus Operator PrometheusRule).

Both stay outside the install (kustomizations, Helm chart, deploy-all.sh, and a
`kubectl apply -f deploy/exporter/`, in their own directory): the PrometheusRule kind exists
only where the Prometheus Operator's CRD does.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from lj_runtimekit.deploy.components import BY_NAME
from lj_runtimekit.deploy.manifests import METRICS_PORT, Obj, Options, labels

MONITORING_DIR = "monitoring"
ALERTS_FILE = "alerts.yaml"
PROMETHEUS_RULE_FILE = "prometheusrule.yaml"
PROMETHEUS_RULE_NAME = "lj-runtimekit-exporter-alerts"
GROUP = "lj-runtimekit-exporter"

_DEVICE = "node, device, uuid, model, kind"
"""The device labels an alert keeps (not the scrape's `job`/`instance`, which change when the
exporter pod is replaced)."""
_GONE = (
    f"max by ({_DEVICE}) (last_over_time(lj_runtimekit_device_healthy[1h]))\n"
    "    unless on (node, uuid) lj_runtimekit_device_healthy"
)
"""Devices reported within the last hour that have no series now."""

DEVICE_UNHEALTHY = f"""\
label_replace(
  max by ({_DEVICE}) (lj_runtimekit_device_healthy) == 0,
  "health", "unhealthy", "", ""
)
or
label_replace(
  ({_GONE})
  and on (node) (lj_runtimekit_runtime_up == 0),
  "health", "unknown", "", ""
)
or
label_replace(
  ({_GONE})
  and on (node) (lj_runtimekit_runtime_up == 1),
  "health", "missing", "", ""
)
"""
"""Unhealthy as the Runtime says, or not known to be healthy: the Runtime is down (device
series vanish with it) or no longer lists the device. A node whose exporter is gone
(`runtime_up` absent) is LjRuntimeKitExporterDown's."""

COLLECTION_ERRORS = """\
(
  sum by (job, instance, source) (rate(lj_runtimekit_exporter_collection_errors_total[5m])) > 0
)
* on (job, instance) group_left (node) lj_runtimekit_exporter_info
"""

EXPORTER_DOWN = f"""\
(
  (up == 0)
  * on (job, instance) group_left (node)
  max by (job, instance, node) (last_over_time(lj_runtimekit_exporter_info[1h]))
)
or on (job, instance)
(up{{instance=~".+:{METRICS_PORT}"}} == 0)
"""
"""A scrape target that served the exporter's metrics within the last hour, or any target
on the exporter's port, failing its scrapes (whatever the scrape job is called)."""

COLLECTION_STALLED = """\
(time() - lj_runtimekit_exporter_last_collection_timestamp_seconds > 300)
* on (job, instance) group_left (node) lj_runtimekit_exporter_info
"""


def _alert(
    name: str, expr: str, duration: str, severity: str, summary: str, description: str
) -> Obj:
    return {
        "alert": name,
        "expr": expr,
        "for": duration,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


def rule_groups() -> list[Obj]:
    """The rule groups (one group of alerts)."""
    rules = [
        _alert(
            "LjRuntimeKitRuntimeDown",
            "lj_runtimekit_runtime_up == 0\n",
            "2m",
            "critical",
            "The exporter on {{ $labels.node }} cannot read the Lingjun Runtime",
            "For 2 minutes every collection on {{ $labels.node }} failed to read the Runtime:"
            " its socket is gone, it does not answer, answers errors, or is older than v1.13.0"
            " (the exporter's log says which). The node's device, MIG and container series"
            " are absent meanwhile.",
        ),
        _alert(
            "LjRuntimeKitDeviceUnhealthy",
            DEVICE_UNHEALTHY,
            "5m",
            "critical",
            "Device {{ $labels.device }} on {{ $labels.node }} is {{ $labels.health }}",
            "Device {{ $labels.device }} ({{ $labels.model }}, {{ $labels.uuid }}) on"
            " {{ $labels.node }}: health {{ $labels.health }} for 5 minutes. unhealthy: the"
            " Runtime reports it unhealthy (see lj_runtimekit_device_xid_errors_total for XID"
            " codes); unknown: the Runtime is down, so its health is not known; missing: the"
            " Runtime no longer lists it.",
        ),
        _alert(
            "LjRuntimeKitExporterCollectionErrors",
            COLLECTION_ERRORS,
            "15m",
            "warning",
            "The exporter on {{ $labels.node }} keeps failing to read {{ $labels.source }}",
            'lj_runtimekit_exporter_collection_errors_total{source="{{ $labels.source }}"}'
            " has been rising for 15 minutes on {{ $labels.node }} ({{ $value | humanize }}/s)."
            " runtime: the Runtime or its per-container metrics; kubelet: the kubelet's"
            " /pods endpoint; apiserver: the API server fallback; annotations: pods with a"
            " malformed assignment annotation (the exporter's log names them).",
        ),
        _alert(
            "LjRuntimeKitExporterDown",
            EXPORTER_DOWN,
            "5m",
            "warning",
            "Prometheus cannot scrape the exporter {{ $labels.instance }}",
            "Scrapes of {{ $labels.instance }} (job {{ $labels.job }}{{ with $labels.node }},"
            " node {{ . }}{{ end }}) have failed for 5 minutes: that node's accelerators are not"
            " monitored.",
        ),
        _alert(
            "LjRuntimeKitExporterNotScraped",
            "absent(lj_runtimekit_exporter_info)\n",
            "15m",
            "warning",
            "Prometheus scrapes no LJ Runtime Kit exporter",
            "No lj_runtimekit_exporter_info series for 15 minutes: no exporter is scraped"
            " (the DaemonSet is not running, or the scrape configuration does not reach port"
            f" {METRICS_PORT} of its pods).",
        ),
        _alert(
            "LjRuntimeKitExporterCollectionStalled",
            COLLECTION_STALLED,
            "5m",
            "warning",
            "The exporter on {{ $labels.node }} has not finished a collection for 5 minutes",
            "The exporter on {{ $labels.node }} serves, but its last collection finished"
            " {{ $value | humanizeDuration }} ago; its /healthz fails, so the kubelet should"
            " restart it.",
        ),
    ]
    return [{"name": GROUP, "rules": rules}]


def prometheus_rule(opts: Options) -> Obj:
    """The rules as a Prometheus Operator PrometheusRule in the install's namespace."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": PROMETHEUS_RULE_NAME,
            "namespace": opts.namespace,
            "labels": labels(BY_NAME["exporter"]),
        },
        "spec": {"groups": rule_groups()},
    }


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the PromQL) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)

ALERTS_HEADER = (
    "# Prometheus alerting rules of the LJ Runtime Kit Exporter (load with rule_files:).\n"
    "# Generated by `make -C deploy manifests` (lj-deploy generate) from deploy/alerts.py;\n"
    "# the same rules as a PrometheusRule: prometheusrule.yaml. Do not edit.\n"
)
PROMETHEUS_RULE_HEADER = (
    "# The Exporter's alerting rules (alerts.yaml) as a Prometheus Operator PrometheusRule.\n"
    "# Generated by `make -C deploy manifests` (lj-deploy generate) from deploy/alerts.py.\n"
    "# Optional, not in the default install: it needs the PrometheusRule CRD\n"
    "# (monitoring.coreos.com/v1).\n"
    "# kubectl apply -f deploy/exporter/monitoring/prometheusrule.yaml\n"
)


def alert_files(deploy_dir: Path, opts: Options) -> dict[Path, str]:
    """Path -> content of the plain rule file and the PrometheusRule."""
    directory = deploy_dir / BY_NAME["exporter"].directory / MONITORING_DIR

    def dump(data: Obj) -> str:
        return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, width=1000)

    return {
        directory / ALERTS_FILE: ALERTS_HEADER + dump({"groups": rule_groups()}),
        directory / PROMETHEUS_RULE_FILE: PROMETHEUS_RULE_HEADER + dump(prometheus_rule(opts)),
    }
