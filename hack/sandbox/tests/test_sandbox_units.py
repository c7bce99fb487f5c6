"""Pure logic of the sandbox: placement table, ledgers, leftovers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.sandbox.bed import STATE_FILE, cleanup_leftovers
from lj_runtimekit.sandbox.dra import ClaimPlacement, ledger_mismatches, pod_claims
from lj_runtimekit.sandbox.workload import invariant_violations, placement_table, placements

P = load_protocol()


def _pod(name: str, assigned: str, allocated: str, phase: str = "Running") -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": {
                P.annotations.assigned_devices: assigned,
                P.annotations.allocated_devices: allocated,
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


def test_init_container_reuse_is_no_violation_and_a_kubelet_difference_is() -> None:
    """An init container and the app container on the same GPU (the kubelet's reuse) hold
    it once; a kubelet record other than the served devices is a ledger mismatch."""
    ann = encode_assignment({"prep": (DeviceShare("GPU-a"),), "main": (DeviceShare("GPU-a"),)})
    pod = _pod("reuse", ann, ann)
    pod["spec"]["initContainers"] = [  # type: ignore[index]
        {"name": "prep", "resources": {"limits": {P.resources.gpu: "1"}}}
    ]
    runtime = {"uid-reuse": {"prep": (DeviceShare("GPU-a"),), "main": (DeviceShare("GPU-a"),)}}
    kubelet = {
        ("ns", "reuse"): {
            "prep": {P.resources.gpu: ["GPU-a"]},
            "main": {P.resources.gpu: ["GPU-a"]},
        }
    }
    rows = placements([pod], P, runtime, kubelet)
    assert invariant_violations(rows, {"n1": runtime}, P) == []
    kubelet[("ns", "reuse")]["main"] = {P.resources.gpu: ["GPU-b"]}
    rows = placements([pod], P, runtime, kubelet)
    (problem,) = invariant_violations(rows, {"n1": runtime}, P)
    assert "container main" in problem
    assert "kubelet" in problem


def test_dra_ledgers_flag_the_runtime_and_the_kubelet_disagreeing_with_the_claim() -> None:
    """A claim's allocation, the Runtime's allocation for it and the kubelet's record of
    its devices: equal is no problem; each difference, and an unallocated claim, is."""
    driver = P.dra.driver
    share = DeviceShare("GPU-a", 30, 25)
    claims = {
        "c1": {
            "status": {
                "allocation": {
                    "devices": {"results": [{"driver": driver, "pool": "n1", "device": "gpu-0"}]}
                }
            }
        }
    }

    def row(runtime: DeviceShare, device: str) -> ClaimPlacement:
        return ClaimPlacement(
            namespace="ns",
            name="p",
            node="n1",
            phase="Running",
            reason="",
            uses={"main": ["c1"]},
            allocated={"c1": [("gpu-0", share)]},
            runtime={"c1": [(runtime,)]},
            kubelet={"main": {"c1": [(driver, "n1", device)]}},
        )

    assert ledger_mismatches(row(share, "gpu-0"), claims, driver) == []
    (runtime,) = ledger_mismatches(row(DeviceShare("GPU-a", 30, 50), "gpu-0"), claims, driver)
    assert "claim c1" in runtime
    assert "Runtime" in runtime
    (kubelet,) = ledger_mismatches(row(share, "gpu-1"), claims, driver)
    assert "container main" in kubelet
    assert "kubelet" in kubelet
    unallocated = row(share, "gpu-0")
    unallocated.uses["main"].append("c2")
    problems = ledger_mismatches(unallocated, claims, driver)
    assert any("claim c2 is not allocated" in p for p in problems), problems


def test_a_pods_claims_named_in_its_spec_or_made_from_a_template() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "shared", "resourceClaimName": "one-for-two"},
                {"name": "own", "resourceClaimTemplateName": "slice"},
            ]
        },
        # Kubernetes lists only the claims made from templates here.
        "status": {"resourceClaimStatuses": [{"name": "own", "resourceClaimName": "pod-own-x"}]},
    }
    assert pod_claims(pod) == {"shared": "one-for-two", "own": "pod-own-x"}
    assert pod_claims({"spec": {"resourceClaims": [{"name": "own"}]}}) == {}
