"""The additive-only check catches every incompatible change and allows additions."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit.proto.internal.contract import compat

PROTO_ROOT = Path(__file__).resolve().parents[1]
CONTROLLER_ROOT = PROTO_ROOT.parent / "Controller" / "api" / "proto"
CONTRACT = "lingjun/runtime/v1/runtime.proto"
FEATURES = "config_service.proto"
"""The Controller's service: NodeFeatureService and its messages, moved out of CONTRACT."""
ROOTS = {CONTRACT: PROTO_ROOT, FEATURES: CONTROLLER_ROOT}
RELEASED = PROTO_ROOT / "released" / "runtime_v1.binpb"


def copied_root(tmp_path: Path, name: str) -> Path:
    """Where `variant` puts the root of the contract file `name`."""
    return tmp_path / str(list(ROOTS).index(name))


def variant(tmp_path: Path, old: str, new: str, where: str = CONTRACT) -> compat.FDS:
    """The contract (both files, each under its own root) with one edit in `where`."""
    for name, root in ROOTS.items():
        text = (root / name).read_text()
        if name == where:
            assert old in text, f"fixture text not found in {name}: {old!r}"
            text = text.replace(old, new, 1)
        target = copied_root(tmp_path, name) / name
        target.parent.mkdir(parents=True)
        target.write_text(text)
    return compat.compile_descriptor_set([copied_root(tmp_path, n) for n in ROOTS], list(ROOTS))


def released() -> compat.FDS:
    return compat.FDS.FromString(RELEASED.read_bytes())


def test_current_contract_is_compatible_with_the_release() -> None:
    current = compat.compile_descriptor_set(list(ROOTS.values()), list(ROOTS))
    assert compat.compare(released(), current) == []


def test_the_split_contract_is_compared_by_full_name() -> None:
    """The node-feature service moved to the Controller's file: the two files together are
    the released contract; the shared file alone lost it."""
    current = compat.compile_descriptor_set(list(ROOTS.values()), list(ROOTS))
    files = {f.name: f.package for f in current.file}
    assert files == {CONTRACT: "lingjun.runtime.v1", FEATURES: "lingjun.runtime.v1"}
    alone = compat.compile_descriptor_set([PROTO_ROOT], [CONTRACT])
    problems = compat.compare(released(), alone)
    assert "service lingjun.runtime.v1.NodeFeatureService was removed" in problems
    assert "message lingjun.runtime.v1.FeatureState was removed" in problems


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "  string changed_by = 4;\n",
            "",
            "field lingjun.runtime.v1.FeatureState.changed_by = 4 was removed",
        ),
        (
            "  bool changed = 2;\n",
            "  bool changed = 5;\n",
            "field lingjun.runtime.v1.FeatureState.changed = 2 was renumbered to 5",
        ),
        (
            "  string requester = 1;\n}\n\n// DisableFeaturesRequest",
            "  bytes requester = 1;\n}\n\n// DisableFeaturesRequest",
            "field lingjun.runtime.v1.EnableFeaturesRequest.requester = 1 was retyped",
        ),
        (
            "  rpc GetFeatureState(GetFeatureStateRequest) returns (FeatureState) {}\n",
            "",
            "rpc lingjun.runtime.v1.NodeFeatureService.GetFeatureState was removed",
        ),
    ],
)
def test_incompatible_changes_in_the_moved_file_are_caught(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    problems = compat.compare(released(), variant(tmp_path, old, new, where=FEATURES))
    assert any(p.startswith(expected) for p in problems), problems


def test_additions_are_allowed(tmp_path: Path) -> None:
    current = variant(
        tmp_path,
        "  string pci_bus_id = 12;\n}",
        "  string pci_bus_id = 12;\n  // new\n  string serial = 13;\n}\nmessage Extra {}\n",
    )
    assert compat.compare(released(), current) == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "  string pci_bus_id = 12;\n",
            "",
            "field lingjun.runtime.v1.Device.pci_bus_id = 12 was removed",
        ),
        (
            "  string pci_bus_id = 12;\n",
            "  string pci_bus_id = 13;\n",
            "field lingjun.runtime.v1.Device.pci_bus_id = 12 was renumbered to 13",
        ),
        (
            "  int32 numa_node = 6;\n",
            "  int64 numa_node = 6;\n",
            "field lingjun.runtime.v1.Device.numa_node = 6 was retyped from"
            " LABEL_OPTIONAL TYPE_INT32 to LABEL_OPTIONAL TYPE_INT64",
        ),
        (
            "  repeated Interconnect peers = 7;\n",
            "  Interconnect peers = 7;\n",
            "field lingjun.runtime.v1.Device.peers = 7 was retyped",
        ),
        (
            "  rpc Release(ReleaseRequest) returns (ReleaseResponse) {}\n",
            "",
            "rpc lingjun.runtime.v1.AllocationService.Release was removed",
        ),
        (
            "rpc WatchDevices(WatchDevicesRequest) returns (stream DeviceEvent)",
            "rpc WatchDevices(WatchDevicesRequest) returns (DeviceEvent)",
            "rpc lingjun.runtime.v1.DeviceService.WatchDevices changed signature",
        ),
        (
            "  DEVICE_MODE_MIG = 3;\n",
            "  DEVICE_MODE_MIG = 4;\n",
            "enum value lingjun.runtime.v1.DeviceMode.DEVICE_MODE_MIG was renumbered from 3 to 4",
        ),
        (
            "  TYPE_REMOVED = 4;\n",
            "",
            "enum value lingjun.runtime.v1.DeviceEvent.Type.TYPE_REMOVED = 4 was removed",
        ),
    ],
)
def test_incompatible_changes_are_caught(tmp_path: Path, old: str, new: str, expected: str) -> None:
    problems = compat.compare(released(), variant(tmp_path, old, new))
    assert any(p.startswith(expected) for p in problems), problems


def test_removed_service_is_caught(tmp_path: Path) -> None:
    text = (PROTO_ROOT / CONTRACT).read_text()
    start = text.index("// MetricsService reports")
    end = text.index("\n}\n", text.index("rpc GetContainerMetrics")) + 3
    problems = compat.compare(released(), variant(tmp_path, text[start:end], ""))
    assert "service lingjun.runtime.v1.MetricsService was removed" in problems


def _cli(released_set: Path, roots: list[Path]) -> list[str]:
    return [
        "--released",
        str(released_set),
        *(arg for root in roots for arg in ("--proto-root", str(root))),
        *ROOTS,
    ]


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert compat.main(_cli(RELEASED, list(ROOTS.values()))) == 0
    variant(tmp_path, "  string changed_by = 4;\n", "", where=FEATURES)
    bad = _cli(RELEASED, [copied_root(tmp_path, name) for name in ROOTS])
    assert compat.main(bad) == 1
    assert "FeatureState.changed_by = 4 was removed" in capsys.readouterr().err
    assert compat.main(_cli(RELEASED, [PROTO_ROOT])) == 2
    assert f"{FEATURES} is under none of {PROTO_ROOT}" in capsys.readouterr().err
