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

__all__ = [
    "DEFAULTS",
    "Annotations",
    "AssignmentError",
    "DeviceShare",
    "Labels",
    "PodAssignment",
    "Protocol",
    "ProtocolError",
    "Resources",
    "decode_assignment",
    "encode_assignment",
    "load_protocol",
]
