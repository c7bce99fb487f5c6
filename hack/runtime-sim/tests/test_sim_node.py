"""Node description parsing: the examples load, every bad field is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lj_runtimekit.runtimesim.inventory import build_inventory
from lj_runtimekit.runtimesim.node import NodeFileError, load_node_file, parse_node
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES

GOOD = {
    "name": "node-a",
    "runtimeVersion": "v1.14.0",
    "devices": [
        {"kind": "gpu", "model": "A100", "memory": "80Gi", "count": 4, "mode": "tdm"},
        {"kind": "gpu", "model": "A100", "memory": "80Gi", "count": 2, "mode": "exclusive"},
        {"kind": "gpu", "model": "A100", "memory": 85899345920, "mode": "mig",
         "migLayout": ["3g.40gb", "4g.40gb"]},
    ],
}  # fmt: skip


def _with(path: str, value: object) -> str:
    """GOOD with the field at a dotted path (list items by index) set to ``value``."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    *parents, last = path.split(".")
    here = data
    for part in parents:
        here = here[int(part)] if part.isdigit() else here[part]
    if value is _DELETE:
        del here[int(last) if last.isdigit() else last]
    elif last.isdigit():
        here[int(last)] = value
    else:
        here[last] = value
    return yaml.safe_dump(data)


_DELETE = object()


def test_examples_load() -> None:
    tdm = load_node_file(EXAMPLE_NODES / "tdm-8gpu.yaml")
    assert [d.mode for d in tdm.devices] == ["tdm"] * 8
    assert {d.memory_bytes for d in tdm.devices} == {80 * 2**30}
    assert [d.numa_node for d in tdm.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    mig = load_node_file(EXAMPLE_NODES / "mig-8gpu.yaml")
    assert [d.mode for d in mig.devices] == ["tdm"] * 6 + ["mig"] * 2
    assert [p.name for p in mig.devices[7].mig_layout] == ["3g.40gb", "4g.40gb"]
    assert len(mig.devices[6].mig_layout) == 7
    ppu = load_node_file(EXAMPLE_NODES / "ppu-16.yaml")
    assert len(ppu.devices) == 16
    assert {d.kind for d in ppu.devices} == {"ppu"}


def test_ids_are_stable_and_short() -> None:
    node = load_node_file(EXAMPLE_NODES / "mig-8gpu.yaml")
    first, again = build_inventory(node), build_inventory(node)
    assert [d.id for d in first] == [d.id for d in again]
    ids = [d.id for d in first] + [m.id for d in first for m in d.mig_instances]
    assert len(set(ids)) == len(ids) == 8 + 9
    assert all(len(i) <= 63 for i in ids)
    assert all(d.id.startswith("GPU-") for d in first)
    assert all(m.id.startswith("MIG-") for d in first for m in d.mig_instances)


def test_interconnect_topologies() -> None:
    tdm = build_inventory(load_node_file(EXAMPLE_NODES / "tdm-8gpu.yaml"))
    assert all(len(d.peers) == 7 for d in tdm)
    assert {p.kind for d in tdm for p in d.peers} == {"nvlink"}
    ppu = build_inventory(load_node_file(EXAMPLE_NODES / "ppu-16.yaml"))
    linked = [[p.peer_id for p in d.peers if p.kind == "nvlink"] for d in ppu]
    assert linked[0] == [ppu[1].id]
    assert linked[3] == [ppu[2].id]


def test_quantities_and_overrides() -> None:
    text = yaml.safe_dump(
        {
            **GOOD,
            "overrides": [{"index": 1, "health": "unhealthy", "healthReason": "XID 79"}],
        }
    )
    node = parse_node(text, "n.yaml")
    assert node.devices[1].healthy is False
    assert node.devices[1].health_reason == "XID 79"
    assert node.devices[6].memory_bytes == 80 * 2**30
    assert node.runtime_version == "v1.14.0"


@pytest.mark.parametrize(
    ("path", "value", "field", "problem"),
    [
        ("devices.2.mode", "shared", "devices[2].mode", "must be one of exclusive, tdm, mig"),
        ("devices.0.kind", "tpu", "devices[0].kind", "must be one of gpu, ppu, amd"),
        ("devices.0.memory", "80 gigs", "devices[0].memory", "quantity like 80Gi"),
        ("devices.0.count", 0, "devices[0].count", "at least 1"),
        ("devices.0.count", "four", "devices[0].count", "must be an integer"),
        ("devices.0.numa", [0, 1], "devices[0].numa", "2 NUMA nodes for 4 devices"),
        ("devices.0.interconnect", "infiniband", "devices[0].interconnect", "pcie, nvlink"),
        ("devices.0.colour", "red", "devices[0].colour", "unknown field"),
        ("devices.0.migLayout", ["1g.10gb"], "devices[0].migLayout", "only allowed when mode"),
        ("devices.2.migLayout", _DELETE, "devices[2].migLayout", "required when mode is mig"),
        ("devices.2.migLayout.1", "5g.40gb", "devices[2].migLayout[1]", "must be one of 1, 2"),
        ("devices.2.migLayout.1", "big", "devices[2].migLayout[1]", "not a MIG profile"),
        ("devices.2.migLayout", ["4g.40gb", "4g.40gb"], "devices[2].migLayout", "8 compute"),
        ("devices.2.migLayout", ["3g.80gb", "3g.80gb"], "devices[2].migLayout", "160 GiB"),
        ("devices.0.model", "", "devices[0].model", "non-empty string"),
        ("devices.0.health", "sick", "devices[0].health", "healthy, unhealthy"),
        ("runtimeVersion", "1.14", "runtimeVersion", "not a version"),
        ("name", "Node_A", "name", "RFC 1123"),
        ("seed", -1, "seed", "at least 0"),
        ("devices", [], "devices", "non-empty list"),
        ("overrides", [{"index": 9}], "overrides[0].index", "no device 9"),
        ("overrides", [{"index": 0, "mode": "mig"}], "overrides[0].migLayout", "required"),
    ],
)
def test_bad_field_is_named(path: str, value: object, field: str, problem: str) -> None:
    with pytest.raises(NodeFileError) as caught:
        parse_node(_with(path, value), "nodes/bad.yaml")
    assert str(caught.value).startswith(f"nodes/bad.yaml: {field}: ")
    assert problem in str(caught.value)


def test_mig_only_for_gpus() -> None:
    text = _with("devices.2.kind", "ppu")
    with pytest.raises(NodeFileError, match=r"devices\[2\]\.mode: mig is only supported"):
        parse_node(text, "n.yaml")


def test_missing_field_and_bad_yaml() -> None:
    with pytest.raises(NodeFileError, match=r"^n.yaml: runtimeVersion: required$"):
        parse_node(_with("runtimeVersion", _DELETE), "n.yaml")
    with pytest.raises(NodeFileError, match=r"^n.yaml: line 1: not valid YAML$"):
        parse_node("name: [unclosed", "n.yaml")
    with pytest.raises(NodeFileError, match=r"^n.yaml: must be a mapping$"):
        parse_node("- a list", "n.yaml")


def test_cli_reports_bad_file_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(_with("devices.2.mode", "shared"))
    result = subprocess.run(
        [sys.executable, "-m", "lj_runtimekit.runtimesim.cli", "--node", str(bad),
         "--socket-dir", str(tmp_path / "s")],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (
        f"lj-runtime-sim: error: {bad}: devices[2].mode: must be one of exclusive, tdm, mig\n"
    )
    missing = subprocess.run(
        [sys.executable, "-m", "lj_runtimekit.runtimesim.cli", "--node",
         str(tmp_path / "nope.yaml"), "--socket-dir", str(tmp_path / "s")],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "nope.yaml: cannot read: No such file or directory" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_cli_reports_unusable_socket_dir(tmp_path: Path) -> None:
    too_long = tmp_path / ("d" * 120)
    result = subprocess.run(
        [sys.executable, "-m", "lj_runtimekit.runtimesim.cli", "--node",
         str(EXAMPLE_NODES / "tdm-8gpu.yaml"), "--socket-dir", str(too_long)],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(f"lj-runtime-sim: error: socket path {too_long}/runtime.sock")
    assert result.stderr.count("\n") == 1
    bad_version = subprocess.run(
        [sys.executable, "-m", "lj_runtimekit.runtimesim.cli", "--node",
         str(EXAMPLE_NODES / "tdm-8gpu.yaml"), "--socket-dir", str(tmp_path), "--version", "2.x"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert bad_version.returncode == 1
    assert bad_version.stderr.startswith("lj-runtime-sim: error: --version: '2.x' is not a version")
