"""The simulator over real unix sockets: every Runtime RPC, each fault, recovery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from lj_runtimekit.controller.pkg.configpb import config_service_pb2 as fpb
from lj_runtimekit.controller.pkg.configpb import config_service_pb2_grpc as frpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2_grpc as rpc
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

WAIT_S = 10.0


class Runtime:
    """Async stubs of every Runtime service on one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.runtime = rpc.RuntimeServiceStub(channel)
        self.devices = rpc.DeviceServiceStub(channel)
        self.allocation = rpc.AllocationServiceStub(channel)
        self.features = frpc.NodeFeatureServiceStub(channel)
        self.metrics = rpc.MetricsServiceStub(channel)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatorProcess]:
    node = EXAMPLE_NODES / "mig-8gpu.yaml"
    with SimulatorProcess(tmp_path / "sock", node, extra_args=("--grace-period", "0.2")) as s:
        yield s


@pytest.fixture
async def runtime(sim: SimulatorProcess) -> AsyncIterator[Runtime]:
    async with grpc.aio.insecure_channel(sim.runtime_target) as channel:
        yield Runtime(channel)


async def _next(
    stream: grpc.aio.UnaryStreamCall[pb.WatchDevicesRequest, pb.DeviceEvent],
) -> pb.DeviceEvent:
    event = await asyncio.wait_for(stream.read(), WAIT_S)
    assert isinstance(event, pb.DeviceEvent)
    return event


async def _devices(runtime: Runtime) -> list[pb.Device]:
    return list((await runtime.devices.ListDevices(pb.ListDevicesRequest())).devices)


async def test_runtime_info(runtime: Runtime) -> None:
    info = await runtime.runtime.GetRuntimeInfo(pb.GetRuntimeInfoRequest())
    assert info.version == "v1.14.0"
    assert info.node_name == "mig-8gpu"
    assert info.api_version == "v1"
    assert {"tdm", "mig", "container-metrics"} <= set(info.capabilities)
    assert "topology" not in info.capabilities


async def test_list_devices(runtime: Runtime) -> None:
    devices = await _devices(runtime)
    assert [d.index for d in devices] == list(range(8))
    assert [d.mode for d in devices] == [pb.DEVICE_MODE_TDM] * 6 + [pb.DEVICE_MODE_MIG] * 2
    first = devices[0]
    assert first.id.startswith("GPU-")
    assert first.kind == pb.DEVICE_KIND_GPU
    assert first.model == "A100-SXM4-80GB"
    assert first.memory_bytes == 80 * 2**30
    assert (devices[0].numa_node, devices[7].numa_node) == (0, 1)
    assert first.health == pb.HEALTH_HEALTHY
    assert first.pci_bus_id == "0000:10:00.0"
    assert {p.peer_id for p in first.peers} == {d.id for d in devices[1:]}
    assert {p.kind for p in first.peers} == {pb.INTERCONNECT_KIND_NVLINK}
    mig = devices[7]
    assert [(m.profile, m.compute_slices) for m in mig.mig_instances] == [
        ("3g.40gb", 3),
        ("4g.40gb", 4),
    ]
    assert all(m.parent_id == mig.id and m.id.startswith("MIG-") for m in mig.mig_instances)
    assert all(m.health == pb.HEALTH_HEALTHY for m in mig.mig_instances)
    assert not first.mig_instances


async def test_watch_sees_unhealthy_then_healthy(sim: SimulatorProcess, runtime: Runtime) -> None:
    stream = runtime.devices.WatchDevices(pb.WatchDevicesRequest())
    snapshot = await _next(stream)
    assert snapshot.type == pb.DeviceEvent.TYPE_SNAPSHOT
    assert len(snapshot.devices) == 8
    target = snapshot.devices[3].id

    sim.set_health(target, healthy=False, reason="XID 79")
    down = await _next(stream)
    assert down.type == pb.DeviceEvent.TYPE_MODIFIED
    assert [(d.id, d.health, d.health_reason) for d in down.devices] == [
        (target, pb.HEALTH_UNHEALTHY, "XID 79")
    ]
    assert down.revision > snapshot.revision
    assert (await _devices(runtime))[3].health == pb.HEALTH_UNHEALTHY

    sim.set_health(target, healthy=True)
    up = await _next(stream)
    assert [(d.id, d.health, d.health_reason) for d in up.devices] == [
        (target, pb.HEALTH_HEALTHY, "")
    ]
    assert up.revision > down.revision
    assert (await _devices(runtime))[3].health == pb.HEALTH_HEALTHY
    stream.cancel()


async def test_mig_instance_health_reaches_watch(sim: SimulatorProcess, runtime: Runtime) -> None:
    stream = runtime.devices.WatchDevices(pb.WatchDevicesRequest())
    snapshot = await _next(stream)
    instance = snapshot.devices[6].mig_instances[2]
    assert "already" in sim.set_health(instance.id, healthy=True)
    sim.set_health(instance.id, healthy=False, reason="ECC")
    event = await _next(stream)
    (parent,) = event.devices
    assert parent.id == instance.parent_id
    assert [m.health for m in parent.mig_instances] == [pb.HEALTH_HEALTHY] * 2 + [
        pb.HEALTH_UNHEALTHY
    ] + [pb.HEALTH_HEALTHY] * 4
    stream.cancel()


async def test_allocate_release_list(runtime: Runtime) -> None:
    devices = await _devices(runtime)
    request = pb.AllocateRequest(
        container_key="uid-1/main",
        pod_namespace="default",
        pod_name="train-0",
        pod_uid="uid-1",
        container_name="main",
        devices=[pb.DeviceRequest(device_id=devices[0].id, core_percent=50, memory_percent=25)],
    )
    first = await runtime.allocation.Allocate(request)
    again = await runtime.allocation.Allocate(request)
    assert first == again
    spec = first.spec
    assert spec.envs["LJ_VISIBLE_DEVICES"] == devices[0].id
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == devices[0].id
    assert spec.envs["LJ_DEVICE_CORE_PERCENT"] == "50"
    assert spec.envs["LJ_DEVICE_MEMORY_PERCENT"] == "25"
    assert [n.container_path for n in spec.device_nodes] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]
    assert spec.annotations["lingjun.com/container-key"] == "uid-1/main"
    assert list(spec.cdi_devices) == [f"lingjun.com/gpu={devices[0].id}"]
    assert first.allocation.pod_name == "train-0"

    listed = await runtime.allocation.ListAllocations(pb.ListAllocationsRequest())
    assert [a.container_key for a in listed.allocations] == ["uid-1/main"]
    (held,) = listed.allocations[0].devices
    assert (held.device_id, held.core_percent, held.memory_percent) == (devices[0].id, 50, 25)
    assert held.slice  # listed as what it is, whatever the request's reading was

    released = await runtime.allocation.Release(pb.ReleaseRequest(container_key="uid-1/main"))
    assert released.released
    again_released = await runtime.allocation.Release(pb.ReleaseRequest(container_key="uid-1/main"))
    assert not again_released.released
    assert not (await runtime.allocation.ListAllocations(pb.ListAllocationsRequest())).allocations


@pytest.mark.parametrize(
    ("devices", "code", "words"),
    [
        ([("GPU-nope", 0, 0)], grpc.StatusCode.INVALID_ARGUMENT, "unknown device GPU-nope"),
        ([(0, 101, 10)], grpc.StatusCode.INVALID_ARGUMENT, "101% core"),
        ([(7, 0, 0)], grpc.StatusCode.FAILED_PRECONDITION, "is in MIG mode"),
        ([], grpc.StatusCode.INVALID_ARGUMENT, "asks for no device"),
    ],
)
async def test_allocate_errors_name_device_and_container(
    runtime: Runtime, devices: list[tuple[int | str, int, int]], code: grpc.StatusCode, words: str
) -> None:
    inventory = await _devices(runtime)
    asked = [
        pb.DeviceRequest(
            device_id=inventory[d].id if isinstance(d, int) else d,
            core_percent=c,
            memory_percent=m,
        )
        for d, c, m in devices
    ]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await runtime.allocation.Allocate(pb.AllocateRequest(container_key="u/c", devices=asked))
    assert caught.value.code() == code
    details = caught.value.details() or ""
    assert words in details
    assert "u/c" in details


async def test_allocate_unhealthy_and_exhausted(sim: SimulatorProcess, runtime: Runtime) -> None:
    devices = await _devices(runtime)
    whole = pb.DeviceRequest(device_id=devices[1].id)
    await runtime.allocation.Allocate(pb.AllocateRequest(container_key="a/c", devices=[whole]))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await runtime.allocation.Allocate(pb.AllocateRequest(container_key="b/c", devices=[whole]))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "held whole by a/c" in (caught.value.details() or "")

    sim.set_health(devices[2].id, healthy=False, reason="XID 48")
    sick = pb.DeviceRequest(device_id=devices[2].id)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await runtime.allocation.Allocate(pb.AllocateRequest(container_key="c/c", devices=[sick]))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{devices[2].id} asked for by container c/c is unhealthy: XID 48" in (
        caught.value.details() or ""
    )


async def test_mig_instance_allocation(runtime: Runtime) -> None:
    devices = await _devices(runtime)
    instance = devices[6].mig_instances[0]
    response = await runtime.allocation.Allocate(
        pb.AllocateRequest(container_key="m/c", devices=[pb.DeviceRequest(device_id=instance.id)])
    )
    assert response.spec.envs["NVIDIA_VISIBLE_DEVICES"] == instance.id
    assert "/dev/nvidia6" in [n.host_path for n in response.spec.device_nodes]
    assert list(response.spec.cdi_devices) == [f"lingjun.com/gpu={instance.id}"]


async def test_features_are_stateful_and_idempotent(runtime: Runtime) -> None:
    features = runtime.features
    state = await features.GetFeatureState(fpb.GetFeatureStateRequest())
    assert (state.enabled, state.changed) == (False, False)
    on = await features.EnableFeatures(fpb.EnableFeaturesRequest(requester="job-1"))
    assert (on.enabled, on.changed, on.changed_by) == (True, True, "job-1")
    assert on.changed_at_unix > 0
    again = await features.EnableFeatures(fpb.EnableFeaturesRequest(requester="job-2"))
    assert (again.enabled, again.changed, again.changed_by) == (True, False, "job-1")
    state = await features.GetFeatureState(fpb.GetFeatureStateRequest())
    assert (state.enabled, state.changed) == (True, False)
    off = await features.DisableFeatures(fpb.DisableFeaturesRequest(requester="job-3"))
    assert (off.enabled, off.changed, off.changed_by) == (False, True, "job-3")
    off_again = await features.DisableFeatures(fpb.DisableFeaturesRequest(requester="job-4"))
    assert (off_again.enabled, off_again.changed) == (False, False)


async def test_metrics_rpcs(runtime: Runtime) -> None:
    response = await runtime.metrics.GetDeviceMetrics(pb.GetDeviceMetricsRequest())
    assert len(response.devices) == 8
    assert response.timestamp_unix_ms > 0
    assert [len(d.mig_instances) for d in response.devices] == [0] * 6 + [7, 2]
    containers = await runtime.metrics.GetContainerMetrics(pb.GetContainerMetricsRequest())
    assert not containers.containers


async def test_latency_fault(sim: SimulatorProcess, runtime: Runtime) -> None:
    assert sim.set_latency(800) == "latency 800 ms"
    started = time.monotonic()
    await runtime.runtime.GetRuntimeInfo(pb.GetRuntimeInfoRequest())
    assert time.monotonic() - started >= 0.8
    sim.set_latency(0)
    started = time.monotonic()
    await runtime.runtime.GetRuntimeInfo(pb.GetRuntimeInfoRequest())
    assert time.monotonic() - started < 0.8


async def test_error_rate_fault(sim: SimulatorProcess, runtime: Runtime) -> None:
    sim.set_error_rate(1.0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await runtime.devices.ListDevices(pb.ListDevicesRequest())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    stream = runtime.devices.WatchDevices(pb.WatchDevicesRequest())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _next(stream)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

    sim.set_error_rate(0.5)
    codes = []
    for _ in range(40):
        try:
            await runtime.runtime.GetRuntimeInfo(pb.GetRuntimeInfoRequest())
            codes.append(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as exc:
            codes.append(exc.code())
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    assert 5 < codes.count(grpc.StatusCode.UNAVAILABLE) < 35

    sim.set_error_rate(0.0)
    assert len(await _devices(runtime)) == 8


@pytest.mark.parametrize(
    ("method", "args", "code"),
    [
        ("set_error_rate", (1.5,), grpc.StatusCode.INVALID_ARGUMENT),
        ("set_version", ("latest",), grpc.StatusCode.INVALID_ARGUMENT),
        ("set_health", ("GPU-nope", False), grpc.StatusCode.NOT_FOUND),
    ],
)
def test_admin_rejects_bad_values(
    sim: SimulatorProcess, method: str, args: tuple[object, ...], code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        getattr(sim, method)(*args)
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == code


async def test_version_change(sim: SimulatorProcess, runtime: Runtime) -> None:
    assert sim.set_version("1.13.0") == "runtime version v1.13.0"
    info = await runtime.runtime.GetRuntimeInfo(pb.GetRuntimeInfoRequest())
    assert info.version == "v1.13.0"
    assert "mig" not in info.capabilities
    sim.set_version("v1.15.2")
    info = await runtime.runtime.GetRuntimeInfo(pb.GetRuntimeInfoRequest())
    assert info.version == "v1.15.2"
    assert "topology" in info.capabilities


async def test_socket_restart(sim: SimulatorProcess, runtime: Runtime) -> None:
    devices = await _devices(runtime)
    await runtime.allocation.Allocate(
        pb.AllocateRequest(container_key="k/c", devices=[pb.DeviceRequest(device_id=devices[0].id)])
    )
    stream = runtime.devices.WatchDevices(pb.WatchDevicesRequest())
    await _next(stream)

    sim.restart_socket(down_ms=500, wait=False)
    assert not sim.runtime_socket.exists()
    with pytest.raises(grpc.aio.AioRpcError):
        await _next(stream)
    sim.wait_ready(WAIT_S)

    async with grpc.aio.insecure_channel(sim.runtime_target) as channel:
        fresh = Runtime(channel)
        listed = await fresh.allocation.ListAllocations(pb.ListAllocationsRequest())
        assert [a.container_key for a in listed.allocations] == ["k/c"]
        watch = fresh.devices.WatchDevices(pb.WatchDevicesRequest())
        snapshot = await _next(watch)
        assert snapshot.type == pb.DeviceEvent.TYPE_SNAPSHOT
        watch.cancel()


def test_version_flag_and_graceful_stop(tmp_path: Path) -> None:
    sim = SimulatorProcess(tmp_path / "s", EXAMPLE_NODES / "ppu-16.yaml", version="1.13.0")
    with sim:
        with grpc.insecure_channel(sim.runtime_target) as channel:
            info = rpc.RuntimeServiceStub(channel).GetRuntimeInfo(pb.GetRuntimeInfoRequest())
        assert info.version == "v1.13.0"
        assert info.node_name == "ppu-16"
    assert sim.stop() == 0
    assert not sim.runtime_socket.exists()
    assert not sim.admin_socket.exists()
    assert "simulator stopped node=ppu-16" in sim.log()
