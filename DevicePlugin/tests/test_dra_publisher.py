"""The slice publisher against a real API server, with the Runtime simulator in process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.dra.publisher import SlicePublisher, server_minor
from lj_runtimekit.deviceplugin.internal.dra.slices import build_slices, counters_apart
from lj_runtimekit.envtest import NodeFactory
from lj_runtimekit.envtest.controlplane import (
    DRA_GATES,
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    dra_gates,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.lingjun.runtimesim.v1 import admin_pb2, admin_pb2_grpc
from lj_runtimekit.proto.pkg.kube import KubeClient, NotFoundError
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET, Simulator
from lj_runtimekit.testkit.dra import RESOURCE_API, synthetic_gpus
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = pytest.mark.controlplane

PROTOCOL = load_protocol()
DRIVER = PROTOCOL.dra.driver
SLICES = f"{RESOURCE_API}/resourceslices"
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def dra_plane(dra_k8s_tools: object) -> Iterator[ControlPlane]:
    """A control plane of the DRA mode's release (no scheduler needed)."""
    config = ControlPlaneConfig(
        version=DRA_VERSION, feature_gates=dra_gates(DRA_VERSION), scheduler=False
    )
    plane = ControlPlane(config).start()
    yield plane
    plane.stop()


@pytest.fixture(scope="module")
def gated_plane(k8s_tools: object) -> Iterator[ControlPlane]:
    """A control plane of the pinned 1.34 with the alpha DRA gates."""
    plane = ControlPlane(ControlPlaneConfig(feature_gates=DRA_GATES, scheduler=False)).start()
    yield plane
    plane.stop()


class Node:
    """A node of a control plane with the Runtime simulator of an example node."""

    def __init__(self, kube: KubeClient, name: str, sim: Simulator, workdir: Path) -> None:
        self.kube = kube
        self.name = name
        self.sim = sim
        self.workdir = workdir

    def publisher(
        self, on_reconnect: Callable[[], Awaitable[None]] | None = None
    ) -> SlicePublisher:
        runtime = RuntimeClient(self.workdir / "sim", RUNTIME_SOCKET, RetryPolicy(attempts=2))
        return SlicePublisher(
            self.kube,
            runtime,
            PROTOCOL,
            self.name,
            max_backoff_s=0.5,
            on_reconnect=on_reconnect,
        )

    def slices(self, driver: str = DRIVER) -> dict[str, dict[str, Any]]:
        """This node's slices of `driver` by name."""
        selector = f"spec.nodeName={self.name},spec.driver={driver}"
        items, _ = self.kube.list_all(SLICES, {"fieldSelector": selector})
        return {s["metadata"]["name"]: s for s in items}

    def devices(self) -> dict[str, dict[str, Any]]:
        return {
            d["name"]: d for s in self.slices().values() for d in s["spec"].get("devices") or ()
        }

    async def wait(self, check: Callable[[], _T | NotYet | None], what: str) -> _T:
        """Wait (in a thread, the publisher runs on the loop) until `check` holds."""
        return await asyncio.to_thread(wait_for, check, 30, what)

    async def at_generation(self, generation: int) -> dict[str, dict[str, Any]]:
        """The pool once every slice has `generation` and the count is complete."""

        def check() -> dict[str, dict[str, Any]] | NotYet:
            slices = self.slices()
            pools = [s["spec"]["pool"] for s in slices.values()]
            if pools and all(
                p["generation"] == generation and p["resourceSliceCount"] == len(pools)
                for p in pools
            ):
                return slices
            return NotYet(str(pools))

        return await self.wait(check, f"pool of {self.name} at generation {generation}")

    async def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Through the simulator's admin API."""
        async with grpc.aio.insecure_channel(f"unix:{self.sim.admin_path}") as channel:
            await admin_pb2_grpc.SimulatorAdminStub(channel).SetDeviceHealth(
                admin_pb2.SetDeviceHealthRequest(
                    device_id=device_id, healthy=healthy, reason=reason
                )
            )


@contextlib.asynccontextmanager
async def node_with_sim(
    plane: ControlPlane, workdir: Path, example: str, name: str
) -> AsyncIterator[Node]:
    api = plane.api_client()
    kube = KubeClient.connect(str(plane.kubeconfig_path))
    factory = NodeFactory(api)
    factory.create(name, gpus=0, wait=False)
    sim = Simulator(load_node_file(EXAMPLE_NODES / f"{example}.yaml"), workdir / "sim")
    await sim.start()
    try:
        yield Node(kube, name, sim, workdir)
    finally:
        await sim.stop(0)
        factory.cleanup()
        kube.close()
        api.close()


@contextlib.asynccontextmanager
async def running(publisher: SlicePublisher) -> AsyncIterator[SlicePublisher]:
    task = asyncio.create_task(publisher.run())
    try:
        yield publisher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()


def _following(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "following the Runtime"]


async def test_publish_adopt_and_generations(
    dra_plane: ControlPlane, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "lj_runtimekit.deviceplugin.internal.dra.publisher")
    async with node_with_sim(dra_plane, workdir, "mig-8gpu", "pub-mig") as node:
        uid = node.kube.request("GET", f"/api/v1/nodes/{node.name}")["metadata"]["uid"]
        async with running(node.publisher()) as publisher:
            first = await node.at_generation(1)
        assert publisher.generation == 1
        assert publisher.missing_gates == ()
        # whole and TDM GPUs, MIG instances, their GPUs' counter sets (apart from 1.35 on)
        assert sorted(first) == [f"pub-mig-{DRIVER}-{n}" for n in range(3)]
        assert [
            bool(first[f"pub-mig-{DRIVER}-{n}"]["spec"].get("sharedCounters")) for n in range(3)
        ] == [False, False, True]
        for obj in first.values():
            assert obj["spec"]["pool"]["name"] == node.name
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        devices = node.devices()
        assert len(devices) == 6 + 9
        assert devices["gpu-0"]["allowMultipleAllocations"] is True
        assert all("consumesCounters" in d for n, d in devices.items() if "-mig-" in n)

        # A slice of the pool left by an earlier plugin, at a higher generation.
        stale = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"pub-mig-{DRIVER}-7"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": 5, "resourceSliceCount": 3},
                "devices": [],
            },
        }
        node.kube.request("POST", SLICES, stale)

        # Restarted: adopts the pool and publishes above its generation; the stale slice goes.
        caplog.clear()
        async with running(node.publisher()) as publisher:
            adopted = await node.at_generation(6)
            assert sorted(adopted) == sorted(first)
            versions = {n: s["metadata"]["resourceVersion"] for n, s in adopted.items()}

            # The Runtime restarts: the same inventory is not written again.
            await node.sim.runtime.restart(300)
            await node.wait(
                lambda: len(_following(caplog)) >= 2, "publisher following the Runtime again"
            )
            assert node.slices() == adopted
            gpu1 = node.sim.state.devices[1].id
            await node.set_health(gpu1, False, "XID 79")
            after = await node.at_generation(7)
            assert publisher.generation == 7
            assert {n: s["metadata"]["resourceVersion"] for n, s in after.items()} != versions
            assert node.devices()["gpu-1"]["taints"][0]["key"] == f"{DRIVER}/unhealthy"

        # The node goes: its slices are garbage-collected with it.
        node.kube.request("DELETE", f"/api/v1/nodes/{node.name}")
        await node.wait(lambda: not node.slices(), f"slices of {node.name} deleted with it")


async def test_inventory_and_on_reconnect(
    dra_plane: ControlPlane, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "lj_runtimekit.deviceplugin.internal.dra.publisher")
    seen: list[tuple[pb.Device, ...] | None] = []
    publisher: SlicePublisher | None = None

    async def reconnected() -> None:
        assert publisher is not None
        seen.append(publisher.inventory())
        if len(seen) == 1:
            raise RuntimeError("preparer not ready")

    async with node_with_sim(dra_plane, workdir, "tdm-8gpu", "pub-reconnect") as node:
        publisher = node.publisher(on_reconnect=reconnected)
        assert publisher.inventory() is None
        ids = sorted(d.id for d in node.sim.state.devices)
        async with running(publisher):
            await node.at_generation(1)
            inventory = publisher.inventory()
            assert inventory is not None
            assert sorted(d.id for d in inventory) == ids
            assert seen == []  # the first connection is no reconnection

            # The Runtime comes back: awaited once, with the inventory just listed; its
            # failure is logged and publishing goes on.
            await node.sim.runtime.restart(300)
            await node.wait(lambda: len(seen) == 1 or NotYet(str(seen)), "on_reconnect awaited")
            assert seen[0] is not None
            assert sorted(d.id for d in seen[0]) == ids
            (failed,) = [r for r in caplog.records if r.getMessage().startswith("on_reconnect")]
            assert failed.levelno == logging.WARNING
            assert failed.__dict__["error"] == "preparer not ready"

            # Watch events update the inventory.
            gpu3 = node.sim.state.devices[3].id
            await node.set_health(gpu3, False, "XID 79")
            await node.at_generation(2)
            inventory = publisher.inventory()
            assert inventory is not None
            assert [d.health for d in inventory if d.id == gpu3] == [pb.HEALTH_UNHEALTHY]

            await node.sim.runtime.restart(300)
            await node.wait(lambda: len(seen) == 2 or NotYet(str(seen)), "on_reconnect again")
            assert node.devices()["gpu-3"]["taints"][0]["value"] == "XID-79"
        assert len(seen) == 2


async def test_slices_deleted_by_someone_else_are_published_again(
    dra_plane: ControlPlane, workdir: Path
) -> None:
    async with (
        node_with_sim(dra_plane, workdir, "mig-8gpu", "pub-wiped") as node,
        running(node.publisher()) as publisher,
    ):
        first = await node.at_generation(1)
        # As the kubelet does when it starts: every slice of the node goes.
        node.kube.request("DELETE", SLICES, query={"fieldSelector": f"spec.nodeName={node.name}"})
        again = await node.at_generation(2)
        assert publisher.generation == 2
        assert sorted(again) == sorted(first)
        assert node.devices().keys() == {
            d["name"] for s in first.values() for d in s["spec"].get("devices") or ()
        }


async def test_a_foreign_edit_is_overwritten_above_its_generation(
    dra_plane: ControlPlane, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "lj_runtimekit.deviceplugin.internal.dra.publisher")
    async with node_with_sim(dra_plane, workdir, "tdm-8gpu", "pub-edit") as node:
        async with running(node.publisher()):
            (name,) = await node.at_generation(1)
            devices = node.devices()
            edited = node.kube.request("GET", f"{SLICES}/{name}")
            edited["spec"]["devices"] = edited["spec"]["devices"][:1]
            edited["spec"]["pool"]["generation"] = 9
            node.kube.request("PUT", f"{SLICES}/{name}", edited)
            await node.at_generation(10)
            assert node.devices() == devices

            # A slice of the pool written by someone else goes.
            extra = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"pub-edit-{DRIVER}-5"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node.name,
                    "pool": {"name": node.name, "generation": 20, "resourceSliceCount": 2},
                    "devices": [],
                },
            }
            node.kube.request("POST", SLICES, extra)
            assert list(await node.at_generation(21)) == [name]
            assert node.devices() == devices
        changed = [r for r in caplog.records if "someone else" in r.getMessage()]
        assert len(changed) == 2


async def test_a_writer_fighting_the_publisher_is_answered_with_backoff(
    dra_plane: ControlPlane, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "lj_runtimekit.deviceplugin.internal.dra.publisher")
    async with node_with_sim(dra_plane, workdir, "tdm-8gpu", "pub-fight") as node:
        async with running(node.publisher()):
            (name,) = await node.at_generation(1)

            def fight(rounds: int) -> float:
                """Overwrite the slice each time the publisher has written it; the seconds
                the rounds took."""
                start = time.monotonic()
                written = 0

                def republished() -> dict[str, Any] | NotYet:
                    obj = node.kube.request("GET", f"{SLICES}/{name}")
                    generation = obj["spec"]["pool"]["generation"]
                    return obj if generation > written else NotYet(f"generation {generation}")

                for _ in range(rounds):
                    obj = wait_for(republished, 30, "the slice written again", interval_s=0.02)
                    written = obj["spec"]["pool"]["generation"] + 1
                    obj["spec"]["pool"]["generation"] = written
                    obj["spec"]["devices"] = []
                    node.kube.request("PUT", f"{SLICES}/{name}", obj)
                return time.monotonic() - start

            # Republished at once, then after 0.4 s, then at most every 0.5 s.
            assert await asyncio.to_thread(fight, 6) >= 0.4 + 3 * 0.5
            await node.at_generation(1 + 6 * 2)
        delays = [r.__dict__["wait_s"] for r in caplog.records if "someone else" in r.getMessage()]
        assert delays == [0, 0.4, 0.5, 0.5, 0.5, 0.5]


async def test_republish_on_health_changes(dra_plane: ControlPlane, workdir: Path) -> None:
    async with node_with_sim(dra_plane, workdir, "mig-8gpu", "pub-health") as node:
        gpu2 = node.sim.state.devices[2].id
        mig = node.sim.state.devices[7]
        async with running(node.publisher()):
            await node.at_generation(1)
            await node.set_health(gpu2, False, "XID 79")
            await node.at_generation(2)
            tainted = {n: d["taints"] for n, d in node.devices().items() if "taints" in d}
            assert list(tainted) == ["gpu-2"]
            (taint,) = tainted["gpu-2"]
            assert taint["effect"] == "NoSchedule"
            assert taint["value"] == "XID-79"

            # The parent of MIG instances goes unhealthy: every instance is tainted.
            await node.set_health(mig.id, False, "ECC")
            await node.at_generation(3)
            tainted = {n: d["taints"] for n, d in node.devices().items() if "taints" in d}
            want = {"gpu-2", *(f"gpu-7-mig-{i.instance_id}" for i in mig.mig_instances)}
            assert set(tainted) == want

            await node.set_health(gpu2, True)
            await node.set_health(mig.id, True)
            await node.at_generation(5)
            assert not any("taints" in d for d in node.devices().values())


async def test_remove_deletes_only_our_slices(dra_plane: ControlPlane, workdir: Path) -> None:
    async with node_with_sim(dra_plane, workdir, "tdm-8gpu", "pub-remove") as node:
        other = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "pub-remove-other"},
            "spec": {
                "driver": "other.example.com",
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }
        node.kube.request("POST", SLICES, other)
        publisher = node.publisher()
        async with running(publisher):
            await node.at_generation(1)
        await publisher.remove()
        assert node.slices() == {}
        assert list(node.slices("other.example.com")) == ["pub-remove-other"]


async def test_missing_gates_are_found_and_unhealthy_devices_left_out(
    control_plane: ControlPlane, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "lj_runtimekit.deviceplugin.internal.dra.publisher")
    async with node_with_sim(control_plane, workdir, "mig-8gpu", "pub-nogates") as node:
        node.sim.state.set_health(node.sim.state.devices[1].id, False, "XID 79")
        async with running(node.publisher()) as publisher:
            # Written with the taint the server dropped, then again without the device.
            await node.at_generation(2)
        assert publisher.missing_gates == (
            "DRAConsumableCapacity",
            "DRADeviceTaints",
            "DRAPartitionableDevices",
        )
        devices = node.devices()
        assert "gpu-1" not in devices
        assert "gpu-0" in devices
        assert not any(
            key in d for d in devices.values() for key in ("taints", "allowMultipleAllocations")
        )
        gates = [str(r.__dict__["gate"]) for r in caplog.records if "gate" in r.__dict__]
        assert sorted(gates) == list(publisher.missing_gates)


@pytest.mark.parametrize(
    ("plane", "mode", "count", "mig", "slices"),
    [
        ("gated_plane", pb.DEVICE_MODE_TDM, 300, 0, 3),
        ("gated_plane", pb.DEVICE_MODE_EXCLUSIVE, 40, 0, 3),
        ("gated_plane", pb.DEVICE_MODE_MIG, 20, 7, 2),
        # counters apart: devices 64 a slice, then counter sets 8 a slice
        ("dra_plane", pb.DEVICE_MODE_TDM, 300, 0, 5),
        ("dra_plane", pb.DEVICE_MODE_EXCLUSIVE, 40, 0, 1 + 5),
        ("dra_plane", pb.DEVICE_MODE_MIG, 20, 7, 3 + 3),
    ],
)
def test_the_api_server_accepts_pools_split_at_its_limits(
    request: pytest.FixtureRequest,
    plane: str,
    mode: pb.DeviceMode.ValueType,
    count: int,
    mig: int,
    slices: int,
) -> None:
    control_plane: ControlPlane = request.getfixturevalue(plane)
    kube = KubeClient.connect(str(control_plane.kubeconfig_path))
    minor = server_minor(kube.request("GET", "/version"))
    node = f"pub-split-{count}-{mig}"
    built = build_slices(
        synthetic_gpus(count, mode, mig),
        node_name=node,
        protocol=PROTOCOL,
        generation=1,
        apart=counters_apart(minor),
    )
    assert len(built) == slices
    try:
        for obj in built:
            stored = kube.request("POST", SLICES, obj)
            assert stored["spec"].get("devices") == obj["spec"].get("devices")
            assert stored["spec"].get("sharedCounters") == obj["spec"].get("sharedCounters")
    finally:
        for obj in built:
            with contextlib.suppress(NotFoundError):
                kube.request("DELETE", f"{SLICES}/{obj['metadata']['name']}")
        kube.close()
