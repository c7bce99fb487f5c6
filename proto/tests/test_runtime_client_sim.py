"""The shared Runtime client against the simulator over a real unix socket."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2_grpc as pb_grpc
from lj_runtimekit.proto.pkg.featuregate import Feature, evaluate
from lj_runtimekit.proto.pkg.runtimeclient import (
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

FAST = RetryPolicy(attempts=8, max_delay_s=10.0, initial_backoff_s=0.05, max_backoff_s=0.5)


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    socket_dir = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp")) / "s"
    with SimulatorProcess(socket_dir, EXAMPLE_NODES / "mig-8gpu.yaml") as process:
        yield process


async def test_every_rpc_through_the_client(sim: SimulatorProcess) -> None:
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        info = await client.runtime_info()
        assert str(await client.version()) == "v1.14.0"
        assert info.node_name == "mig-8gpu"
        report = evaluate(await client.version())
        assert report.is_enabled(Feature.MIG)
        assert not report.is_enabled(Feature.TOPOLOGY_GANG)

        devices = await client.list_devices()
        assert [d.index for d in devices] == list(range(8))
        modes = [d.mode for d in devices]
        assert modes.count(pb.DEVICE_MODE_MIG) == 2
        mig = devices[6].mig_instances[0]

        slice_request = pb.AllocateRequest(
            container_key="uid-1/main",
            pod_namespace="ns",
            pod_name="p",
            container_name="main",
            pod_uid="uid-1",
            devices=[pb.DeviceRequest(device_id=devices[0].id, core_percent=30, memory_percent=20)],
        )
        response = await client.allocate(slice_request)
        assert response.spec.envs["LJ_VISIBLE_DEVICES"] == devices[0].id
        assert f"lingjun.com/gpu={devices[0].id}" in response.spec.cdi_devices
        mig_request = pb.AllocateRequest(
            container_key="uid-2/main", devices=[pb.DeviceRequest(device_id=mig.id)]
        )
        await client.allocate(mig_request)
        keys = {a.container_key for a in await client.list_allocations()}
        assert keys == {"uid-1/main", "uid-2/main"}

        metrics = await client.device_metrics()
        assert len(metrics.devices) == 8
        assert len(metrics.devices[6].mig_instances) == 7
        containers = await client.container_metrics()
        assert {c.container_key for c in containers.containers} == keys

        assert await client.release("uid-1/main") is True
        assert await client.release("uid-1/main") is False


async def test_call_runs_a_stub_on_the_clients_channel(sim: SimulatorProcess) -> None:
    """The hook for a component's own service on the Runtime socket: the client's channel,
    and its errors."""
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        info = await client.call(
            "GetRuntimeInfo",
            lambda channel: pb_grpc.RuntimeServiceStub(channel).GetRuntimeInfo(
                pb.GetRuntimeInfoRequest(), timeout=client.retry.call_timeout_s
            ),
        )
        assert info == await client.runtime_info()
        bad = pb.AllocateRequest(container_key="u/c", devices=[pb.DeviceRequest(device_id="x")])
        with pytest.raises(RuntimeCallError) as excinfo:
            await client.call(
                "Allocate",
                lambda channel: pb_grpc.AllocationServiceStub(channel).Allocate(bad),
            )
        assert excinfo.value.method == "Allocate"


async def test_runtime_errors_carry_code_and_message(sim: SimulatorProcess) -> None:
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        request = pb.AllocateRequest(
            container_key="uid-9/c", devices=[pb.DeviceRequest(device_id="GPU-nope")]
        )
        with pytest.raises(RuntimeCallError) as excinfo:
            await client.allocate(request)
    assert excinfo.value.method == "Allocate"
    assert "GPU-nope" in str(excinfo.value)


async def test_watch_sees_unhealthy_and_back(sim: SimulatorProcess) -> None:
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        devices = await client.list_devices()
        target = devices[2].id
        stream = client.watch_devices()
        snapshot = await anext(stream)
        assert snapshot.type == pb.DeviceEvent.TYPE_SNAPSHOT
        await asyncio.to_thread(sim.set_health, target, False, "XID 79")
        event = await asyncio.wait_for(anext(stream), 5)
        assert (event.devices[0].id, event.devices[0].health) == (target, pb.HEALTH_UNHEALTHY)
        await asyncio.to_thread(sim.set_health, target, True)
        event = await asyncio.wait_for(anext(stream), 5)
        assert (event.devices[0].id, event.devices[0].health) == (target, pb.HEALTH_HEALTHY)
        await stream.aclose()


async def test_client_survives_a_socket_restart(sim: SimulatorProcess) -> None:
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        before = await client.list_devices()
        stream = client.watch_devices()
        await anext(stream)
        await asyncio.to_thread(sim.restart_socket, 300, wait=False)
        with pytest.raises(RuntimeUnavailableError, match="watch on socket"):
            await asyncio.wait_for(anext(stream), 10)
        # Unary calls ride out the outage with bounded retries on the same client.
        after = await client.list_devices()
        assert [d.id for d in after] == [d.id for d in before]


async def test_retries_ride_out_a_failing_runtime(sim: SimulatorProcess) -> None:
    await asyncio.to_thread(sim.set_error_rate, 0.2)
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        for _ in range(10):
            assert len(await client.list_devices()) == 8
    await asyncio.to_thread(sim.set_error_rate, 1.0)
    policy = RetryPolicy(attempts=3, initial_backoff_s=0.01)
    async with RuntimeClient(sim.socket_dir, retry=policy) as client:
        with pytest.raises(RuntimeUnavailableError, match="after 3 attempts"):
            await client.list_devices()


async def test_version_change_is_seen_by_a_new_client(sim: SimulatorProcess) -> None:
    await asyncio.to_thread(sim.set_version, "v1.13.0")
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        report = evaluate(await client.version())
    assert not report.is_enabled(Feature.MIG)
    report.require_base()


def test_runtime_ctl_shows_devices(sim: SimulatorProcess) -> None:
    command = [sys.executable, "-m", "lj_runtimekit.proto.cmd.runtime_ctl.main"]
    result = subprocess.run(
        [*command, "--socket-dir", str(sim.socket_dir), "devices"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["INDEX", "ID", "KIND"]
    assert len(lines) == 9
    assert "1g.10gb" in lines[7]


def test_runtime_ctl_absent_runtime_is_one_line() -> None:
    command = [sys.executable, "-m", "lj_runtimekit.proto.cmd.runtime_ctl.main"]
    empty = tempfile.mkdtemp(prefix="lj", dir="/tmp")
    result = subprocess.run(
        [*command, "--socket-dir", empty, "--attempts", "1", "info"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("lj-runtime-ctl: Runtime not reachable on socket")
    assert "Traceback" not in result.stderr
