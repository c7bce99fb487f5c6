"""Device shares (the pod annotations' encoding) to and from the contract's DeviceRequest.

One place decides what 0 means: in a `DeviceShare` both percentages 0 is the
whole device and a slice is taken literally (a core-only slice has memory 0);
on the wire a slice carries `slice=true`, and a request without it keeps the
contract's older reading (0 or 100 = whole).
"""

from __future__ import annotations

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import DeviceShare

WHOLE_PERCENT = 100


def normalize(share: DeviceShare) -> DeviceShare:
    """One spelling per meaning: a 100 % core and 100 % memory slice is the whole device."""
    if share.core_percent >= WHOLE_PERCENT and share.memory_percent >= WHOLE_PERCENT:
        return DeviceShare(share.device_id)
    return share


def to_request(share: DeviceShare) -> pb.DeviceRequest:
    """The contract's DeviceRequest for a share."""
    share = normalize(share)
    if share.whole:
        return pb.DeviceRequest(device_id=share.device_id)
    return pb.DeviceRequest(
        device_id=share.device_id,
        core_percent=share.core_percent,
        memory_percent=share.memory_percent,
        slice=True,
    )


def from_request(request: pb.DeviceRequest) -> DeviceShare:
    """The share a contract DeviceRequest stands for."""
    core, memory = request.core_percent, request.memory_percent
    if not request.slice:
        if core in (0, WHOLE_PERCENT) and memory in (0, WHOLE_PERCENT):
            return DeviceShare(request.device_id)
        core, memory = core or WHOLE_PERCENT, memory or WHOLE_PERCENT
    return normalize(DeviceShare(request.device_id, core, memory))
