"""Pure logic of the sandbox: KWOK stage gating, placement table, flags, leftovers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.sandbox.bed import STATE_FILE, cleanup_leftovers
from lj_runtimekit.sandbox.stages import ADMITTED_ANNOTATION, sandbox_stages
from lj_runtimekit.sandbox.workload import placement_table, placements

P = load_protocol()


def test_pod_ready_waits_for_admission_and_other_stages_are_kept() -> None:
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(sandbox_stages())}
    assert {"pod-ready", "pod-complete", "pod-fail", "pod-delete"} <= set(docs)
    keys = [e["key"] for e in docs["pod-ready"]["spec"]["selector"]["matchExpressions"]]
    assert f'.metadata.annotations["{ADMITTED_ANNOTATION}"]' in keys
    complete = docs["pod-complete"]["spec"]["selector"]["matchExpressions"]
    assert all(ADMITTED_ANNOTATION not in e["key"] for e in complete)


def _pod(name: str, assigned: str, allocated: str, phase: str = "Running") -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": {
                P.annotations.assigned_devices: assigned,
                P.annotations.allocated_devices: allocated,
                ADMITTED_ANNOTATION: json.dumps({"main": {P.resources.core: ["u1"]}}),
            },
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": {P.resources.core: "30"}}}],
        },
        "status": {"phase": phase},
    }


def test_table_shows_agreement_and_flags_a_mismatch() -> None:
    good = encode_assignment({"main": (DeviceShare("GPU-a", 30, 25),)})
    other = encode_assignment({"main": (DeviceShare("GPU-b", 30, 25),)})
    runtime = {
        "uid-ok": {"main": (DeviceShare("GPU-a", 30, 25),)},
        "uid-bad": {"main": (DeviceShare("GPU-a", 30, 25),)},
    }
    rows = placements([_pod("ok", good, good), _pod("bad", good, other)], P, runtime)
    table = placement_table(rows, {"GPU-a": "gpu#0", "GPU-b": "gpu#1"})
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "gpu#0 30%c/25%m" in lines["ok"]
    assert "MISMATCH" not in lines["ok"]
    assert "MISMATCH plugin: gpu#1 30%c/25%m" in lines["bad"]


def test_leftover_cleanup_never_kills_a_process_that_is_not_ours(tmp_path: Path) -> None:
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        (tmp_path / STATE_FILE).write_text(json.dumps({"process_groups": [stranger.pid]}))
        assert cleanup_leftovers(tmp_path) == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plugin-dir=/tmp/x", "--pods-port=1"], "--node-name"),
        (
            ["--node-name=n", "--plugin-dir=/tmp/x", "--pods-port=1", "--kubeconfig=/nope"],
            "not a file",
        ),
    ],
)
def test_kubelet_shim_flag_mistakes_are_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lj_runtimekit.sandbox.kubelet", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
