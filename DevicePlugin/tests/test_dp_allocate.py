"""Allocate (whole, slice, MIG, unplaced pods) and GetPreferredAllocation via the kubelet shim."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID
from lj_runtimekit.testkit.kubelet.bed import ANN, CORE, GPU, MEMORY, RES, Bed
from lj_runtimekit.testkit.kubelet.kubelet import AdmissionError

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]


def unit_devices(ids: list[str]) -> set[str]:
    return {i.rpartition("::")[0] for i in ids}


async def test_whole_devices_follow_the_scheduler(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        want = [bed.gpu(2), bed.gpu(5)]
        pod = bed.pod({"main": {GPU: 2}}, {"main": [DeviceShare(d) for d in want]})
        opts = (await bed.kubelet.admit(pod))["main"]
        assert opts.device_ids[GPU] == want  # GetPreferredAllocation steered the kubelet
        assert opts.envs["LJ_VISIBLE_DEVICES"] == ",".join(want)
        assert set(opts.devices) >= {"/dev/nvidia2", "/dev/nvidia5"}
        assert opts.mounts
        assert opts.cdi_devices == [f"lingjun.com/gpu={d}" for d in want]
        assert opts.annotations["lingjun.com/pod-name"] == pod["metadata"]["name"]
        (alloc,) = await bed.allocations()
        assert alloc.container_key == f"{pod['metadata']['uid']}/main"
        assert [d.device_id for d in alloc.devices] == want


async def test_slice_gets_its_device_for_core_and_memory(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        share = DeviceShare(bed.gpu(3), 30, 20)
        pod = bed.pod({"main": {CORE: 30, MEMORY: 20}}, {"main": [share]})
        opts = (await bed.kubelet.admit(pod))["main"]
        assert len(opts.device_ids[CORE]) == 30
        assert len(opts.device_ids[MEMORY]) == 20
        assert unit_devices(opts.device_ids[CORE]) == {bed.gpu(3)}
        assert unit_devices(opts.device_ids[MEMORY]) == {bed.gpu(3)}
        assert opts.envs["LJ_VISIBLE_DEVICES"] == bed.gpu(3)
        assert opts.envs["LJ_DEVICE_CORE_PERCENT"] == "30"
        assert opts.envs["LJ_DEVICE_MEMORY_PERCENT"] == "20"
        (alloc,) = await bed.allocations()
        assert [(d.device_id, d.core_percent, d.memory_percent) for d in alloc.devices] == [
            (bed.gpu(3), 30, 20)
        ]


async def test_mig_instance(make_bed: BedFactory) -> None:
    mig = RES.mig("3g.40gb")
    async with make_bed("mig-8gpu", wait_for=(GPU, mig)) as bed:
        (instance,) = [m for d in bed.devices for m in d.mig_instances if m.profile == "3g.40gb"]
        pod = bed.pod({"train": {mig: 1}}, {"train": [DeviceShare(instance.id)]})
        opts = (await bed.kubelet.admit(pod))["train"]
        assert opts.device_ids[mig] == [instance.id]
        assert opts.envs["LJ_VISIBLE_DEVICES"] == instance.id
        assert any(p.startswith("/dev/nvidia-caps/") for p in opts.devices)


async def test_a_pod_not_placed_by_the_scheduler_is_refused(make_bed: BedFactory) -> None:
    """No assignment: refused with the reason, nothing handed out (never another pod's)."""
    async with make_bed() as bed:
        for res, limits in ((GPU, {GPU: 1}), (CORE, {CORE: 10, MEMORY: 10})):
            unplaced = bed.pod({"main": limits}, listed=False)
            with pytest.raises(AdmissionError) as err:
                await bed.kubelet.admit(unplaced)
            message = str(err.value)
            assert "FAILED_PRECONDITION" in message
            assert "was not placed by the Runtime Kit scheduler" in message
            assert f"pod {unplaced['metadata']['namespace']}/{unplaced['metadata']['name']}" in (
                message
            )
            assert res in message
            bed.pods.remove(unplaced["metadata"]["uid"])
        assert await bed.allocations() == []


async def _admit_slice_with_uid(bed: Bed) -> dict[str, Any]:
    """A 30 %/20 % slice pod on GPU 3, its UID in its assignment as the scheduler writes it,
    admitted by the kubelet."""
    share = DeviceShare(bed.gpu(3), 30, 20)
    original = bed.pod({"main": {CORE: 30, MEMORY: 20}}, {"main": [share]})
    original["metadata"]["annotations"][ASSIGNED_POD_UID] = original["metadata"]["uid"]
    bed.pods.put(original)
    await bed.kubelet.admit(original)
    return original


async def test_a_copy_of_another_pods_assignment_is_refused(make_bed: BedFactory) -> None:
    """A pod created on the node with a copy of a running pod's annotations (the scheduler
    wrote that pod's UID in them), `allocating` or `allocated`: refused with the reason,
    nothing allocated in its name; the original keeps its slice."""
    async with make_bed() as bed:
        original = await _admit_slice_with_uid(bed)
        for phase in ("allocating", "allocated"):
            forged = copy.deepcopy(original)
            forged["metadata"].update(uid=f"forged-{phase}", name=f"forged-{phase}")
            forged["metadata"]["annotations"][ANN.bind_phase] = phase
            with pytest.raises(AdmissionError) as err:
                await bed.kubelet.admit(forged)
            message = str(err.value)
            assert "FAILED_PRECONDITION" in message
            assert f"for the pod with UID {original['metadata']['uid']}" in message, message
            assert f"not for this one (forged-{phase})" in message, message
            (alloc,) = await bed.allocations()
            assert alloc.container_key == f"{original['metadata']['uid']}/main"
            assert [(d.device_id, d.core_percent, d.memory_percent) for d in alloc.devices] == [
                (bed.gpu(3), 30, 20)
            ]


async def test_required_uid_refuses_a_copy_with_its_uid_removed(make_bed: BedFactory) -> None:
    """With --require-assignment-uid, a copy of a running pod's annotations with the UID key
    removed (`allocating` or `allocated`) is refused, nothing allocated in its name; the
    scheduler's own pod, UID included, is served."""
    async with make_bed(plugin_args=["--require-assignment-uid=true"]) as bed:
        original = await _admit_slice_with_uid(bed)
        for phase in ("allocating", "allocated"):
            forged = copy.deepcopy(original)
            forged["metadata"].update(uid=f"stripped-{phase}", name=f"stripped-{phase}")
            forged["metadata"]["annotations"][ANN.bind_phase] = phase
            del forged["metadata"]["annotations"][ASSIGNED_POD_UID]
            bed.pods.put(forged)
            with pytest.raises(AdmissionError) as err:
                await bed.kubelet.admit(forged)
            message = str(err.value)
            assert "FAILED_PRECONDITION" in message
            assert f"{ASSIGNED_POD_UID} is missing" in message, message
            bed.pods.remove(forged["metadata"]["uid"])
            (alloc,) = await bed.allocations()
            assert alloc.container_key == f"{original['metadata']['uid']}/main"


async def test_kubelet_devices_outside_the_assignment_are_refused(make_bed: BedFactory) -> None:
    """What a container gets is exactly the kubelet's IDs: other IDs than the scheduler's
    assignment are refused, not swapped for the assignment."""
    async with make_bed() as bed:
        bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(2))]})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bed.kubelet.allocate(GPU, [[bed.gpu(4)]])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "which the scheduler did not assign to the pod" in (err.value.details() or "")
        share = DeviceShare(bed.gpu(3), 30, 20)
        bed.pod({"main": {CORE: 30, MEMORY: 20}}, {"main": [share]}, name="sliced")
        units = [f"{bed.gpu(5)}::{i}" for i in range(30)]
        assert await bed.allocations() == []
        # The refused pod is rejected by the kubelet, though still listed Pending: the
        # sliced pod is the one waiting, and units of another device are refused too.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bed.kubelet.allocate(CORE, [units])
        assert f"the scheduler assigned it a slice of {bed.gpu(3)}" in (err.value.details() or "")
        assert await bed.allocations() == []


async def test_units_a_running_slice_holds_are_not_preferred_again(make_bed: BedFactory) -> None:
    """The kubelet's device manager can offer a running container's slice units as free: a
    PodResources `List` while another container's Allocate is under way rebuilds the
    kubelet's allocated set without the IDs in flight. The plugin then prefers the units
    nobody holds, so no unit is recorded for two containers."""
    async with make_bed() as bed:
        first = bed.pod(
            {"main": {CORE: 20, MEMORY: 20}}, {"main": [DeviceShare(bed.gpu(3), 20, 20)]}
        )
        held = (await bed.kubelet.admit(first))["main"].device_ids
        bed.pod({"main": {CORE: 20, MEMORY: 20}}, {"main": [DeviceShare(bed.gpu(3), 20, 20)]})
        for resource in (CORE, MEMORY):
            every_unit = [f"{bed.gpu(3)}::{i}" for i in range(100)]
            assert set(held[resource]) < set(every_unit)
            chosen = await bed.kubelet.preferred(resource, every_unit, 20)
            assert len(chosen) == 20
            assert unit_devices(chosen) == {bed.gpu(3)}
            assert not set(chosen) & set(held[resource])


async def test_core_only_slice_takes_no_memory(make_bed: BedFactory) -> None:
    """A {core: 30, memory: 0} slice holds 0 % memory: a 100 % memory slice still fits."""
    async with make_bed() as bed:
        core_only = bed.pod({"main": {CORE: 30}}, {"main": [DeviceShare(bed.gpu(1), 30, 0)]})
        opts = (await bed.kubelet.admit(core_only))["main"]
        assert opts.envs["LJ_DEVICE_MEMORY_PERCENT"] == "0"
        memory_only = bed.pod(
            {"main": {MEMORY: 100}}, {"main": [DeviceShare(bed.gpu(1), 0, 100)]}, listed=False
        )
        opts = (await bed.kubelet.admit(memory_only))["main"]
        assert opts.envs["LJ_DEVICE_CORE_PERCENT"] == "0"
        held = sorted(
            (d.core_percent, d.memory_percent) for a in await bed.allocations() for d in a.devices
        )
        assert held == [(0, 100), (30, 0)]


async def test_preferred_allocation_by_interconnect_then_numa(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        everything = [bed.gpu(i) for i in range(8)]
        assert sorted(await bed.kubelet.preferred(GPU, everything, 2)) == sorted(
            [bed.gpu(0), bed.gpu(1)]
        )
        # All-to-all NVLink: NUMA decides (GPUs 4..7 share NUMA node 1).
        got = await bed.kubelet.preferred(GPU, [bed.gpu(0), bed.gpu(4), bed.gpu(5)], 2)
        assert sorted(got) == sorted([bed.gpu(4), bed.gpu(5)])
        got = await bed.kubelet.preferred(GPU, everything, 2, must_include=[bed.gpu(6)])
        assert bed.gpu(6) in got
        assert len(got) == 2
        assert {bed.devices[i].numa_node for i in range(8) if bed.gpu(i) in got} == {1}
        # A pending pod's assignment comes first, even when it is not the best-connected set.
        want = [bed.gpu(3), bed.gpu(6)]
        bed.pod({"main": {GPU: 2}}, {"main": [DeviceShare(d) for d in want]})
        assert sorted(await bed.kubelet.preferred(GPU, everything, 2)) == sorted(want)


async def test_preferred_allocation_by_nvlink_pairs(make_bed: BedFactory) -> None:
    async with make_bed("ppu-16", wait_for=(RES.ppu,)) as bed:
        ppu = [bed.gpu(i) for i in range(16)]
        # Linked in pairs (0-1, 2-3, ...): 1 has no link to 2, but 2 and 3 are peers.
        assert sorted(await bed.kubelet.preferred(RES.ppu, ppu[1:4], 2)) == sorted(ppu[2:4])
        assert sorted(await bed.kubelet.preferred(RES.ppu, ppu, 2)) == sorted(ppu[0:2])


async def test_plugin_restart_never_hands_out_an_assignment_twice(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        first = bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(1))]})
        await bed.kubelet.admit(first)
        bed.plugin.stop()
        bed.plugin.start()
        await bed.kubelet.wait_registered((GPU,), 30, since=time.monotonic())
        # A kubelet that lost its checkpoint asks again for the running container's devices:
        # the same answer, nothing new handed out.
        again = await bed.kubelet.allocate(GPU, [[bed.gpu(1)]])
        assert again.container_responses[0].envs["LJ_VISIBLE_DEVICES"] == bed.gpu(1)
        assert len(await bed.allocations()) == 1
        # The first pod is done (rebuilt from the Runtime): the second is the one waiting.
        second = bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(2))]})
        response = await bed.kubelet.allocate(GPU, [[bed.gpu(2)]])
        assert response.container_responses[0].envs["LJ_VISIBLE_DEVICES"] == bed.gpu(2)
        keys = sorted(a.container_key for a in await bed.allocations())
        assert keys == sorted(f"{p['metadata']['uid']}/main" for p in (first, second))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bed.kubelet.allocate(GPU, [[bed.gpu(6)]])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pod on node" in (err.value.details() or "")


async def test_a_pod_being_deleted_keeps_its_devices_until_its_containers_are_gone(
    make_bed: BedFactory,
) -> None:
    """deletionTimestamp set, containers still in their grace period: the Runtime share
    stays; once the pod is terminal (or gone from the list) it is released."""
    async with make_bed() as bed:
        pod = bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(1))]})
        await bed.kubelet.admit(pod)
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        pod["status"] = {"phase": "Running"}
        bed.pods.put(pod)
        # Several clean-up rounds (every 0.5 s, release grace 0) pass: still held.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert len(await bed.allocations()) == 1, bed.fail("released while running")
            await asyncio.sleep(0.2)
        pod["status"] = {"phase": "Succeeded"}
        bed.pods.put(pod)
        deadline = time.monotonic() + 10
        while await bed.allocations():
            assert time.monotonic() < deadline, bed.fail("not released once terminal")
            await asyncio.sleep(0.1)
