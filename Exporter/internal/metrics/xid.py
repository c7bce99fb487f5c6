"""XID errors by XID code.

The Runtime reports one XID counter per device (`DeviceMetrics.xid_errors`) and
names the latest error in the device's health reason (`Device.health_reason`,
e.g. `XID 79`). Each rise of the counter seen by a collection is counted under
the code that reason names in the same collection (read after the counter), so
the codes of a device add up to the Runtime's counter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

UNKNOWN_CODE = ""
"""The `xid` label of errors whose code the health reason did not name."""

_XID = re.compile(r"\bxid\b(?:\s*\([^)]*\))?\s*:?\s*(\d+)", re.IGNORECASE)
"""`XID 79`, `Xid: 79`, or the driver's `Xid (PCI:0000:3b:00): 79`."""


def xid_code(reason: str) -> str:
    """The XID code a health reason names (`XID 79` -> `79`); UNKNOWN_CODE when none."""
    match = _XID.search(reason)
    return str(int(match.group(1))) if match else UNKNOWN_CODE


@dataclass
class _DeviceXids:
    total: int
    by_code: dict[str, int] = field(default_factory=lambda: {UNKNOWN_CODE: 0})


class XidCodes:
    """Splits each device's XID counter by code, across collections.

    A rise between two collections goes to the code the reason names at the later
    one: when several errors happen within one interval, all count under the last
    code; when the device recovered before the reason was read, under
    UNKNOWN_CODE. What a device counted before the Exporter first saw it goes to
    the code named then. A counter lower than before (the Runtime restarted)
    starts the device's codes over, as the Runtime's counter did.
    """

    def __init__(self) -> None:
        self._devices: dict[str, _DeviceXids] = {}

    def update(self, device_id: str, total: int, reason: str) -> Mapping[str, int]:
        """Take a device's counter and health reason; its errors by code (UNKNOWN_CODE
        always present)."""
        seen = self._devices.get(device_id)
        if seen is None or total < seen.total:
            seen = self._devices[device_id] = _DeviceXids(0)
        if total > seen.total:
            code = xid_code(reason)
            seen.by_code[code] = seen.by_code.get(code, 0) + total - seen.total
            seen.total = total
        return seen.by_code
