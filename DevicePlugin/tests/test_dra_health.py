"""The kubelet's DRAResourceHealth client against the plugin's service socket, over a real
unix socket, with the Runtime simulator (its admin API flips device health)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.dra.checkpoint import PreparedClaim
from lj_runtimekit.deviceplugin.internal.dra.claims import ClaimRef
from lj_runtimekit.deviceplugin.internal.dra.health import (
    DeviceHealth,
    HealthServicer,
    device_health,
)
from lj_runtimekit.deviceplugin.internal.dra.server import (
    HEALTH_SERVICE,
    SUPPORTED_SERVICES,
    PluginServers,
)
from lj_runtimekit.proto.k8s.drahealth.v1alpha1 import api_pb2 as health
from lj_runtimekit.proto.k8s.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2 as reg
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.lingjun.runtimesim.v1 import admin_pb2, admin_pb2_grpc
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET, Simulator
from lj_runtimekit.testkit.dra import synthetic_gpus

DRIVER = "dra.lingjun.com"
POOL = "health-node"
STEP_S = 20.0
REFRESH_S = 1.0


class _NoClaims:
    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        raise AssertionError("no claims in these tests")

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        raise AssertionError("no claims in these tests")


async def _message(stream: Any) -> health.NodeWatchResourcesResponse:
    message = await asyncio.wait_for(stream.read(), STEP_S)
    assert isinstance(message, health.NodeWatchResourcesResponse)
    assert {d.device.pool_name for d in message.devices} == {POOL}
    assert all(d.last_updated_time > 0 for d in message.devices)
    assert {d.health_check_timeout_seconds for d in message.devices} == {round(3 * REFRESH_S)}
    return message


async def _next(stream: Any) -> dict[str, int]:
    """The next message of a NodeWatchResources stream, as device name -> health."""
    return {d.device.device_name: d.health for d in (await _message(stream)).devices}


@pytest.fixture
async def sim(workdir: Path) -> AsyncIterator[Simulator]:
    simulator = Simulator(load_node_file(EXAMPLE_NODES / "mig-8gpu.yaml"), workdir / "sim")
    await simulator.start()
    try:
        yield simulator
    finally:
        await simulator.stop(0)


@pytest.fixture
async def health_stub(
    sim: Simulator, workdir: Path
) -> AsyncIterator[health_grpc.DRAResourceHealthAsyncStub]:
    runtime = RuntimeClient(workdir / "sim", RUNTIME_SOCKET, RetryPolicy())
    servers = PluginServers(
        workdir / "kubelet",
        DRIVER,
        _NoClaims(),
        HealthServicer(runtime, POOL, refresh_s=REFRESH_S),
    )
    await servers.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{servers.service_path}") as channel:
            yield health_grpc.DRAResourceHealthStub(channel)
    finally:
        await servers.stop(0)
        await runtime.close()


async def _set_health(sim: Simulator, device_id: str, healthy: bool) -> None:
    async with grpc.aio.insecure_channel(f"unix:{sim.admin_path}") as channel:
        await admin_pb2_grpc.SimulatorAdminStub(channel).SetDeviceHealth(
            admin_pb2.SetDeviceHealthRequest(device_id=device_id, healthy=healthy, reason="XID 79")
        )


async def test_health_of_every_published_device_then_each_change(
    sim: Simulator, health_stub: health_grpc.DRAResourceHealthAsyncStub, workdir: Path
) -> None:
    stream = health_stub.NodeWatchResources(health.NodeWatchResourcesRequest())
    first = await _next(stream)
    runtime = RuntimeClient(workdir / "sim", RUNTIME_SOCKET, RetryPolicy())
    devices = await runtime.list_devices()
    await runtime.close()
    names = set(device_health(devices))
    assert set(first) == names
    assert any("-mig-" in n for n in names)
    assert any("-mig-" not in n for n in names)
    assert set(first.values()) == {health.HEALTHY}

    # A MIG-mode GPU goes bad: its instances with it; it comes back.
    mig_gpu = next(d for d in devices if d.mode == pb.DEVICE_MODE_MIG)
    instances = {n for n in names if n.startswith(f"gpu-{mig_gpu.index}-mig-")}
    assert instances
    await _set_health(sim, mig_gpu.id, False)
    bad = await _message(stream)
    assert {d.device.device_name for d in bad.devices if d.health == health.UNHEALTHY} == instances
    assert {d.message for d in bad.devices if d.health == health.UNHEALTHY} == {"XID 79"}
    await _set_health(sim, mig_gpu.id, True)
    good = await _message(stream)
    assert {d.health for d in good.devices} == {health.HEALTHY}
    assert {d.message for d in good.devices} == {""}

    # No change: the complete list again within the refresh, so the kubelet's health check
    # timeout never turns a device unknown.
    started = asyncio.get_running_loop().time()
    again = await _message(stream)
    assert asyncio.get_running_loop().time() - started < 3 * REFRESH_S
    assert [(d.device, d.health) for d in again.devices] == [
        (d.device, d.health) for d in good.devices
    ]
    assert min(d.last_updated_time for d in again.devices) >= max(
        d.last_updated_time for d in good.devices
    )
    stream.cancel()


async def test_stream_ends_unavailable_when_the_runtime_goes(
    sim: Simulator, health_stub: health_grpc.DRAResourceHealthAsyncStub
) -> None:
    stream = health_stub.NodeWatchResources(health.NodeWatchResourcesRequest())
    await asyncio.wait_for(stream.read(), STEP_S)
    await sim.runtime.restart(60_000)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(stream.read(), STEP_S)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Runtime" in (info.value.details() or "")


async def test_registration_names_the_health_service(workdir: Path) -> None:
    """Kubelets from 1.36 on open the health stream only for a plugin that names it."""
    runtime = RuntimeClient(workdir / "sim", RUNTIME_SOCKET, RetryPolicy())
    for health_api, want in ((None, []), (HealthServicer(runtime, POOL), [HEALTH_SERVICE])):
        servers = PluginServers(workdir / "kubelet", DRIVER, _NoClaims(), health_api)
        await servers.start()
        try:
            target = f"unix:{servers.registration_path}"
            async with grpc.aio.insecure_channel(target) as channel:
                info = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest())
        finally:
            await servers.stop(0)
        assert list(info.supported_versions) == [*SUPPORTED_SERVICES, *want]
    await runtime.close()


def test_names_follow_the_slices() -> None:
    gpus = synthetic_gpus(2, pb.DEVICE_MODE_MIG, 2) + synthetic_gpus(1, pb.DEVICE_MODE_TDM)
    gpus[2].index = 5
    gpus[1].mig_instances[0].health = pb.HEALTH_UNHEALTHY
    gpus[2].health = pb.HEALTH_UNHEALTHY
    gpus[2].health_reason = "XID 48"
    assert device_health(gpus) == {
        "gpu-0-mig-7": DeviceHealth(True, ""),
        "gpu-0-mig-8": DeviceHealth(True, ""),
        "gpu-1-mig-7": DeviceHealth(False, "MIG instance unhealthy"),
        "gpu-1-mig-8": DeviceHealth(True, ""),
        "gpu-5": DeviceHealth(False, "XID 48"),
    }
