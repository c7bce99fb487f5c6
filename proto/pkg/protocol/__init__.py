"""Protocol constants shared by the Device Plugin, Scheduler Framework and Exporter."""

from lj_runtimekit.proto.pkg.protocol.assignment import (
    ADMISSION_KUBELET_ORDER,
    ADMISSION_SERIAL,
    BIND_PHASE_ALLOCATED,
    BIND_PHASE_ALLOCATING,
    AssignmentError,
    DeviceShare,
    PodAssignment,
    decode_assignment,
    encode_assignment,
    pod_shares,
)
from lj_runtimekit.proto.pkg.protocol.constants import (
    DEFAULTS,
    Annotations,
    Labels,
    Protocol,
    ProtocolError,
    Resources,
    load_protocol,
    parse_protocol_text,
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
    "ADMISSION_KUBELET_ORDER",
    "ADMISSION_SERIAL",
    "BIND_PHASE_ALLOCATED",
    "BIND_PHASE_ALLOCATING",
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
    "parse_protocol_text",
    "pod_shares",
]
