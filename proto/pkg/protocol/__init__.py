"""Protocol constants shared by the Device Plugin, Scheduler Framework and Exporter."""

from lj_runtimekit.proto.pkg.protocol.assignment import (
    AssignmentError,
    DeviceShare,
    PodAssignment,
    decode_assignment,
    encode_assignment,
)
from lj_runtimekit.proto.pkg.protocol.constants import (
    DEFAULTS,
    Annotations,
    Labels,
    Protocol,
    ProtocolError,
    Resources,
    load_protocol,
)
from lj_runtimekit.proto.pkg.protocol.inventory import (
    DeviceLink,
    InventoryError,
    MigSlot,
    NodeDevice,
    decode_inventory,
    encode_inventory,
)

__all__ = [
    "DEFAULTS",
    "Annotations",
    "AssignmentError",
    "DeviceLink",
    "DeviceShare",
    "InventoryError",
    "Labels",
    "MigSlot",
    "NodeDevice",
    "PodAssignment",
    "Protocol",
    "ProtocolError",
    "Resources",
    "decode_assignment",
    "decode_inventory",
    "encode_assignment",
    "encode_inventory",
    "load_protocol",
]
