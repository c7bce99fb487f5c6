"""`kubectl apply --dry-run=server` goes through the real API server's validation."""

from __future__ import annotations

import pytest

from lj_runtimekit.envtest.pytest_plugin import Kubectl

pytestmark = pytest.mark.controlplane

VALID = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: dry-run-ok
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: registry.example/lj/train:1
        resources:
          limits:
            alibabacloud.com/gpu: "1"
"""

# Container names must be RFC 1123 labels: only the API server knows that.
INVALID = VALID.replace("dry-run-ok", "dry-run-bad").replace("name: main", "name: Main_Container")


def test_server_dry_run_accepts_a_valid_manifest(kubectl: Kubectl) -> None:
    result = kubectl("apply", "--dry-run=server", "-f", "-", input_text=VALID)

    assert result.returncode == 0, result.stderr
    assert "job.batch/dry-run-ok created (server dry run)" in result.stdout
    # A dry run creates nothing.
    missing = kubectl("get", "job", "dry-run-ok")
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr


def test_server_dry_run_rejects_an_invalid_manifest_with_the_api_server_message(
    kubectl: Kubectl,
) -> None:
    result = kubectl("apply", "--dry-run=server", "-f", "-", input_text=INVALID)

    assert result.returncode != 0
    assert 'The Job "dry-run-bad" is invalid' in result.stderr
    assert "spec.template.spec.containers[0].name" in result.stderr
    assert "RFC 1123" in result.stderr
