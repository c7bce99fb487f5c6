"""make cluster-up / cluster-down: the control plane in the background for people."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.controlplane


def envtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lj_runtimekit.envtest.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_cluster_up_prints_kubeconfig_and_cluster_down_stops_it(
    k8s_tools: dict[str, Path], tmp_path: Path
) -> None:
    state = tmp_path / "cluster"
    up = envtest("cluster-up", f"--state-dir={state}", "--nodes=1")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in up.stdout
        nodes = subprocess.run(
            [
                str(k8s_tools["kubectl"]),
                f"--kubeconfig={state / 'kubeconfig'}",
                "get",
                "nodes",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert nodes.returncode == 0, nodes.stderr
        assert "node/gpu-node-0" in nodes.stdout
        again = envtest("cluster-up", f"--state-dir={state}")
        assert again.returncode == 0
        assert "already running" in again.stdout
        pids = [int(p) for p in (state / "component.pids").read_text().split()]
    finally:
        down = envtest("cluster-down", f"--state-dir={state}")
    assert down.returncode == 0, down.stderr
    assert "cluster stopped" in down.stdout
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
