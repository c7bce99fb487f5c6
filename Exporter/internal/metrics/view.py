"""What one collection read from the Runtime: the input of the metric families."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.featuregate import GateReport


@dataclass(frozen=True)
class RuntimeView:
    """What the Runtime reported in one collection (the messages are only read)."""

    version: str
    gates: GateReport
    devices: tuple[pb.Device, ...]
    device_metrics: Mapping[str, pb.DeviceMetrics]
    container_metrics: tuple[pb.ContainerMetrics, ...] | None
    """None when the per-container metrics feature is off or their call failed."""
    container_error: str | None = None
    """Why GetContainerMetrics failed while the rest answered (device series stay)."""
    claims: tuple[pb.Allocation, ...] = ()
    """The Runtime's allocations of DRA ResourceClaims (claim_uid set): one per claim, keyed
    `claim/<claim uid>`, shared by every container using the claim."""
    claims_error: str | None = None
    """Why ListAllocations failed while the rest answered (no claim is attributed)."""
