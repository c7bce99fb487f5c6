"""The Exporter's alerting rules (deploy/exporter/monitoring/alerts.yaml): valid for `promtool check
rules`, each alert unit-tested with input series by `promtool test rules`
(tests/alerts/exporter_alerts_test.yaml), and shipped unchanged as a PrometheusRule."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
UNIT_TESTS = HERE / "alerts" / "exporter_alerts_test.yaml"


def _promtool(lj: Any, *args: str, cwd: Path) -> str:
    promtool = lj.require_tool("promtool")
    result = subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def _monitoring(lj: Any) -> Path:
    return Path(lj.REPO) / "deploy" / "exporter" / "monitoring"


def _rules(lj: Any) -> Path:
    return _monitoring(lj) / "alerts.yaml"


def _alerts(groups: list[dict[str, Any]]) -> set[str]:
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def test_rules_pass_promtool_check_and_their_unit_tests(lj: Any) -> None:
    rules = _rules(lj)
    groups = yaml.safe_load(rules.read_text())["groups"]
    alerts = _alerts(groups)
    assert alerts >= {
        "LjRuntimeKitRuntimeDown",
        "LjRuntimeKitDeviceUnhealthy",
        "LjRuntimeKitExporterCollectionErrors",
        "LjRuntimeKitExporterDown",
        "LjRuntimeKitExporterNotScraped",
    }
    assert f"SUCCESS: {len(alerts)} rules found" in _promtool(
        lj, "check", "rules", str(rules), cwd=HERE
    )
    # Every alert has unit tests, and each of them fires in one.
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    assert {case["alertname"] for case in cases} == alerts
    assert {case["alertname"] for case in cases if case["exp_alerts"]} == alerts
    assert "SUCCESS" in _promtool(lj, "test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)


def test_prometheus_rule_carries_the_same_rules(lj: Any, tmp_path: Path) -> None:
    """The optional PrometheusRule holds exactly the plain file's groups and stays out of
    the default install (its CRD exists only with the Prometheus Operator)."""
    rule = yaml.safe_load((_monitoring(lj) / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == "kube-system"
    assert rule["spec"]["groups"] == yaml.safe_load(_rules(lj).read_text())["groups"]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(rule["spec"]))
    _promtool(lj, "check", "rules", str(spec), cwd=tmp_path)
    kustomization = yaml.safe_load((_monitoring(lj).parent / "kustomization.yaml").read_text())
    assert not [r for r in kustomization["resources"] if "monitoring" in r]
