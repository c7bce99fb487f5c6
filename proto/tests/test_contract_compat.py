"""The additive-only check catches every incompatible change and allows additions."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit.proto.internal.contract import compat

PROTO_ROOT = Path(__file__).resolve().parents[1]
CONTRACT = "lingjun/runtime/v1/runtime.proto"
RELEASED = PROTO_ROOT / "released" / "runtime_v1.binpb"


def variant(tmp_path: Path, old: str, new: str) -> compat.FDS:
    text = (PROTO_ROOT / CONTRACT).read_text()
    assert old in text, f"fixture text not found in the contract: {old!r}"
    target = tmp_path / CONTRACT
    target.parent.mkdir(parents=True)
    target.write_text(text.replace(old, new, 1))
    return compat.compile_descriptor_set(tmp_path, [CONTRACT])


def released() -> compat.FDS:
    return compat.FDS.FromString(RELEASED.read_bytes())


def test_current_contract_is_compatible_with_the_release() -> None:
    current = compat.compile_descriptor_set(PROTO_ROOT, [CONTRACT])
    assert compat.compare(released(), current) == []


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
    target = tmp_path / CONTRACT
    target.parent.mkdir(parents=True)
    target.write_text(text[:start] + text[end:])
    problems = compat.compare(released(), compat.compile_descriptor_set(tmp_path, [CONTRACT]))
    assert "service lingjun.runtime.v1.MetricsService was removed" in problems


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--released", str(RELEASED), "--proto-root", str(PROTO_ROOT), CONTRACT]
    assert compat.main(args) == 0
    variant(tmp_path, "  string pci_bus_id = 12;\n", "")
    bad = ["--released", str(RELEASED), "--proto-root", str(tmp_path), CONTRACT]
    assert compat.main(bad) == 1
    assert "pci_bus_id = 12 was removed" in capsys.readouterr().err
