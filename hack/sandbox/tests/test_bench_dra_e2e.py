"""Pure logic of the DRA end-to-end benchmark's checks."""

from __future__ import annotations

from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY, memory_step
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.sandbox.bench_dra_e2e import cdi_lines, kubelet_holdings, split_observed
from lj_runtimekit.testkit.dra import example_devices
from lj_runtimekit.testkit.invariant import sharing_violations

P = load_protocol()
DRIVER = P.dra.driver
NODE = "n1"
DEVICES = {NODE: example_devices("tdm-8gpu", NODE)}
STEP = memory_step(DEVICES[NODE][0])


def _claim(name: str, device: str, cores: int | None = None, memory: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = {"driver": DRIVER, "pool": NODE, "device": device, "request": "r"}
    if cores is not None:
        result["consumedCapacity"] = {CORES: str(cores), MEMORY: str(memory * STEP)}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_kubelet_holdings_count_a_claim_once_and_find_overcommit() -> None:
    claims = {
        "a": _claim("a", "gpu-0", 60, 50),
        "b": _claim("b", "gpu-0", 60, 10),
        "w": _claim("w", "gpu-1"),
    }
    records = {
        ("ns", "p1"): {"main": {"a": [(DRIVER, NODE, "gpu-0")]}},
        ("ns", "p2"): {"main": {"a": [(DRIVER, NODE, "gpu-0")]}},  # the same claim, shared
        ("ns", "p3"): {"x": {"b": [(DRIVER, NODE, "gpu-0")], "w": [(DRIVER, NODE, "gpu-2")]}},
        ("ns", "gone"): {"main": {"deleted": [(DRIVER, NODE, "gpu-3")]}},
    }
    holdings, problems = kubelet_holdings(records, claims, DRIVER, DEVICES)
    assert [(h[1], h[2].core_percent) for h in holdings] == [("a", 60), ("b", 60)]
    assert problems == [
        f"kubelet: ns/p3 container x claim w device {(DRIVER, NODE, 'gpu-2')} is not in its"
        " allocation"
    ]
    (line,) = sharing_violations("kubelet", holdings)
    assert "120% core" in line


def _pod(name: str, phase: str, claims: dict[str, str], uses: dict[str, list[str]]) -> Any:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"pod-{name}"},
        "spec": {
            "containers": [
                {"name": c, "resources": {"claims": [{"name": u} for u in used]}}
                for c, used in uses.items()
            ]
        },
        "status": {
            "phase": phase,
            "resourceClaimStatuses": [
                {"name": k, "resourceClaimName": v} for k, v in claims.items()
            ],
        },
    }


def test_cdi_lines_tell_a_foreign_claim_from_a_missing_record() -> None:
    claims = {"a": _claim("a", "gpu-0"), "b": _claim("b", "gpu-1")}

    def device_id(uid: str) -> str:
        return f"cdi={uid}"

    pods = [
        _pod("ok", "Running", {"c": "a"}, {"main": ["c"]}),
        _pod("thief", "Running", {"c": "b"}, {"main": ["c"], "idle": []}),
        _pod("new", "Running", {"c": "b"}, {"main": ["c"]}),
        _pod("pending", "Pending", {"c": "b"}, {"main": ["c"]}),
        _pod("shared", "Running", {}, {"main": ["c"]}),
    ]
    pods[-1]["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": "a"}]
    recorded = {
        ("pod-ok", "main"): ["cdi=uid-a"],
        ("pod-thief", "main"): ["cdi=uid-a", "cdi=uid-b"],
        ("pod-shared", "main"): ["cdi=uid-a"],
    }
    conflicts, mismatches = cdi_lines(pods, claims, recorded, device_id)
    assert conflicts == ["cdi: ns/thief container main got a's cdi=uid-a"]
    assert mismatches == [
        "ns/thief container main: CDI ['cdi=uid-a', 'cdi=uid-b'], claims' ['cdi=uid-b']",
        "ns/new container main: CDI None, claims' ['cdi=uid-b']",
    ]


def test_split_observed_keeps_sharing_breaches_apart() -> None:
    lines = [
        "claims: device GPU-0 on n1 given whole to ['a', 'b']",
        "runtime: device GPU-1 on n1 has 120% core, 20% memory in slices (['a', 'b'])",
        "runtime: claim uid u on n1 has no live claim",
        "ns/p: claim c [], Runtime []",
    ]
    conflicts, others = split_observed(lines)
    assert conflicts == lines[:2]
    assert others == lines[2:]
