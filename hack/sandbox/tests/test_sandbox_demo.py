"""`lj-sandbox up --dra --exit-after-demo` end to end: the demo on DRA nodes (one of each
kind) runs, every pod of it Running, and its ledgers agree."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from lj_runtimekit.sandbox import cli

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]


def test_dra_demo_runs_and_its_ledgers_agree(
    k8s_tools: object, capsys: pytest.CaptureFixture[str]
) -> None:
    state = Path(tempfile.mkdtemp(prefix="ljsbx", dir="/tmp"))
    began = time.monotonic()
    try:
        argv = ["up", "--dra", "--nodes", "3", "--state-dir", str(state), "--exit-after-demo"]
        code = cli.main(argv)
    finally:
        out = capsys.readouterr().out
        cli.main(["down", "--state-dir", str(state)])
        shutil.rmtree(state, ignore_errors=True)
    print(out)
    print(f"DRA demo: {time.monotonic() - began:.1f}s from start to stop")
    assert code == 0, out[-3000:]
    assert "ledgers agree for every pod (claims' allocations" in out
    table = out[out.index("POD ") : out.index("ledgers agree")]
    rows = [line.split() for line in table.splitlines()[1:] if line.strip()]
    pods = {row[0]: row for row in rows if not row[0].startswith("[")}
    assert set(pods) == {"slice-a", "slice-b", "slice-c", "whole-1", "mig-1g", "ppu-1"}
    assert {row[2] for row in pods.values()} == {"Running"}, table
    devices = {name: " ".join(row[4:]) for name, row in pods.items()}
    assert devices["slice-a"] == "gpu-0 30%c/25%m", table
    assert devices["whole-1"] == "gpu-0", table
    assert devices["mig-1g"].startswith("gpu-6-mig-"), table
    assert devices["ppu-1"].startswith("ppu-"), table
