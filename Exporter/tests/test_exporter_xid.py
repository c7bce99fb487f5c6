"""XID errors by code: the code read from the health reason, each rise of the Runtime's
counter counted under it, the codes adding up to the counter."""

from __future__ import annotations

import pytest

from lj_runtimekit.exporter.internal.metrics.xid import UNKNOWN_CODE, XidCodes, xid_code


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("XID 79", "79"),
        ("xid: 48, pid=1234", "48"),
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", "79"),
        ("XID 013", "13"),
        ("", UNKNOWN_CODE),
        ("ECC double-bit error", UNKNOWN_CODE),
        ("marked unhealthy", UNKNOWN_CODE),
        ("HYBRID 5", UNKNOWN_CODE),
    ],
)
def test_code_from_the_health_reason(reason: str, code: str) -> None:
    assert xid_code(reason) == code


def test_each_rise_counts_under_the_code_named_then() -> None:
    xids = XidCodes()
    assert xids.update("gpu-0", 0, "") == {UNKNOWN_CODE: 0}
    assert xids.update("gpu-0", 1, "XID 79") == {UNKNOWN_CODE: 0, "79": 1}
    # Still unhealthy with the same reason and no new error: nothing more.
    assert xids.update("gpu-0", 1, "XID 79") == {UNKNOWN_CODE: 0, "79": 1}
    # Two errors within one interval: both under the code named last.
    assert xids.update("gpu-0", 3, "XID 48") == {UNKNOWN_CODE: 0, "79": 1, "48": 2}
    # Recovered before the reason was read: the code is unknown.
    assert xids.update("gpu-0", 4, "") == {UNKNOWN_CODE: 1, "79": 1, "48": 2}
    assert sum(xids.update("gpu-0", 4, "").values()) == 4


def test_first_sight_and_runtime_restart() -> None:
    xids = XidCodes()
    # Counted before the Exporter first saw the device: under the code named then.
    assert xids.update("gpu-1", 2, "XID 79") == {UNKNOWN_CODE: 0, "79": 2}
    assert xids.update("gpu-2", 0, "XID 79") == {UNKNOWN_CODE: 0}
    # The Runtime restarted (its counter went down): the device's codes start over.
    assert xids.update("gpu-1", 1, "XID 31") == {UNKNOWN_CODE: 0, "31": 1}
    assert xids.update("gpu-2", 0, "") == {UNKNOWN_CODE: 0}
