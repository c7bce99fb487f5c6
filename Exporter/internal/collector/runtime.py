"""One read of the Runtime: version and gates, inventory, device and container samples."""

from __future__ import annotations

from types import MappingProxyType

from lj_runtimekit.exporter.internal.metrics.view import RuntimeView
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.featuregate import Feature, GateReport, evaluate
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeCallError, RuntimeClient


def _kind_enabled(value: int, gates: GateReport) -> bool:
    """False for a device of a kind whose feature gate is off (an unknown kind is kept,
    exported as `unknown`)."""
    kind = devicekind.by_value(value)
    return kind is None or kind.feature is None or gates.is_enabled(kind.feature)


async def read_runtime(client: RuntimeClient) -> RuntimeView:
    """Read the Runtime once; RuntimeUnavailableError / RuntimeCallError / RuntimeTooOldError.

    Device samples are taken before container samples: the Runtime's container
    samples describe the device sample taken just before them. The DRA claim allocations
    (ListAllocations) are read right after, to attribute the claims' samples. The inventory is
    read after both, so a health reason (the code of an XID the device sample
    counted) is at least as recent as the counters.
    """
    info = await client.runtime_info()
    gates = evaluate(info.version)
    gates.require_base()
    samples = await client.device_metrics()
    containers: tuple[pb.ContainerMetrics, ...] | None = None
    container_error: str | None = None
    if gates.is_enabled(Feature.CONTAINER_METRICS):
        try:
            containers = tuple((await client.container_metrics()).containers)
        except RuntimeCallError as exc:
            container_error = str(exc)
    claims: tuple[pb.Allocation, ...] = ()
    claims_error: str | None = None
    try:
        claims = tuple(a for a in await client.list_allocations() if a.claim_uid)
    except RuntimeCallError as exc:
        claims_error = str(exc)
    devices = await client.list_devices()
    devices = [d for d in devices if _kind_enabled(d.kind, gates)]
    if not gates.is_enabled(Feature.MIG):
        for device in devices:
            del device.mig_instances[:]
    return RuntimeView(
        version=str(gates.runtime_version),
        gates=gates,
        devices=tuple(sorted(devices, key=lambda d: d.index)),
        device_metrics=MappingProxyType({m.device_id: m for m in samples.devices}),
        container_metrics=containers,
        container_error=container_error,
        claims=claims,
        claims_error=claims_error,
    )
