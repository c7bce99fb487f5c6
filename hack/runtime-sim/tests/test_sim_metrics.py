"""Simulated metrics over the socket: deterministic for a seed, driven by allocations."""

from __future__ import annotations

from pathlib import Path

import grpc

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2_grpc as rpc
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

GIB = 2**30


async def _samples(sim: SimulatorProcess, count: int) -> list[pb.GetDeviceMetricsResponse]:
    async with grpc.aio.insecure_channel(sim.runtime_target) as channel:
        metrics = rpc.MetricsServiceStub(channel)
        out = []
        for _ in range(count):
            response = await metrics.GetDeviceMetrics(pb.GetDeviceMetricsRequest())
            response.ClearField("timestamp_unix_ms")
            out.append(response)
        return out


async def test_same_seed_same_numbers_other_seed_others(tmp_path: Path) -> None:
    node = EXAMPLE_NODES / "mig-8gpu.yaml"
    runs = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        with SimulatorProcess(tmp_path / name, node, seed=seed) as sim:
            runs.append(await _samples(sim, 3))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    first, second, third = runs[0]
    assert first != second
    for before, after in ((first, second), (second, third)):
        for old, new in zip(before.devices, after.devices, strict=True):
            assert new.energy_joules > old.energy_joules


async def test_metrics_reflect_allocations(tmp_path: Path) -> None:
    with SimulatorProcess(tmp_path / "s", EXAMPLE_NODES / "mig-8gpu.yaml") as sim:
        async with grpc.aio.insecure_channel(sim.runtime_target) as channel:
            devices = (
                await rpc.DeviceServiceStub(channel).ListDevices(pb.ListDevicesRequest())
            ).devices
            allocation = rpc.AllocationServiceStub(channel)
            metrics = rpc.MetricsServiceStub(channel)
            gpu, instance = devices[0], devices[7].mig_instances[1]
            for key, device, core, memory in (
                ("p1/a", gpu.id, 50, 50),
                ("p2/b", gpu.id, 30, 25),
                ("p3/c", instance.id, 0, 0),
            ):
                await allocation.Allocate(
                    pb.AllocateRequest(
                        container_key=key,
                        pod_namespace="team",
                        pod_name=key.split("/")[0],
                        container_name=key.split("/")[1],
                        devices=[
                            pb.DeviceRequest(
                                device_id=device, core_percent=core, memory_percent=memory
                            )
                        ],
                    )
                )
            sample = await metrics.GetDeviceMetrics(pb.GetDeviceMetricsRequest())
            used = await metrics.GetContainerMetrics(pb.GetContainerMetricsRequest())

    by_key = {c.container_key: c for c in used.containers}
    assert sorted(by_key) == ["p1/a", "p2/b", "p3/c"]
    a, b, c = by_key["p1/a"], by_key["p2/b"], by_key["p3/c"]
    assert (a.pod_namespace, a.pod_name, a.container_name, a.device_id) == (
        "team",
        "p1",
        "a",
        gpu.id,
    )
    assert 0.5 * 0.3 <= a.utilization_ratio <= 0.5 * 0.95
    assert 0 < a.memory_used_bytes <= 0.5 * 80 * GIB
    assert 0 < b.utilization_ratio <= 0.3
    assert c.device_id == instance.id
    assert 0 < c.memory_used_bytes <= 40 * GIB

    dev = {d.device_id: d for d in sample.devices}
    busy, idle = dev[gpu.id], dev[devices[1].id]
    containers = a.utilization_ratio + b.utilization_ratio
    assert containers <= busy.utilization_ratio <= containers + 0.03 + 1e-9
    assert busy.memory_used_bytes >= a.memory_used_bytes + b.memory_used_bytes
    assert busy.memory_total_bytes == 80 * GIB
    assert idle.utilization_ratio < 0.03
    assert busy.power_watts > idle.power_watts
    assert busy.temperature_celsius > idle.temperature_celsius

    (mig_idle, mig_busy) = dev[devices[7].id].mig_instances
    assert mig_busy.instance_id == instance.id
    assert mig_busy.memory_total_bytes == 40 * GIB
    assert mig_busy.utilization_ratio >= c.utilization_ratio
    assert mig_busy.memory_used_bytes == c.memory_used_bytes
    assert mig_idle.utilization_ratio < 0.03
    assert mig_idle.memory_used_bytes == 0


async def test_unhealthy_device_counts_xid(tmp_path: Path) -> None:
    """An XID fault counts one XID error and its code is in the reported health reason;
    other reasons count none."""
    with SimulatorProcess(tmp_path / "s", EXAMPLE_NODES / "tdm-8gpu.yaml") as sim:
        async with grpc.aio.insecure_channel(sim.runtime_target) as channel:
            inventory = rpc.DeviceServiceStub(channel)
            devices = (await inventory.ListDevices(pb.ListDevicesRequest())).devices
            sim.set_health(devices[2].id, healthy=False, reason="XID 79")
            reported = (await inventory.ListDevices(pb.ListDevicesRequest())).devices[2]
            sim.set_health(devices[2].id, healthy=False, reason="XID 48")  # another one
            sim.set_health(devices[2].id, healthy=True)
            sim.set_health(devices[3].id, healthy=False, reason="ECC double-bit error")
            sim.set_health(devices[4].id, healthy=False)
            metrics = rpc.MetricsServiceStub(channel)
            sample = await metrics.GetDeviceMetrics(pb.GetDeviceMetricsRequest())
    assert (reported.health, reported.health_reason) == (pb.HEALTH_UNHEALTHY, "XID 79")
    assert [d.xid_errors for d in sample.devices] == [0, 0, 2, 0, 0, 0, 0, 0]
