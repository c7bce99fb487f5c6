"""Identical slice pods on one node: refused while several wait, exact one at a time."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import pytest

from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import CORE, MEMORY, Bed
from lj_runtimekit.testkit.kubelet.kubelet import AdmissionError

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]


async def test_several_waiting_pods_are_refused_not_guessed(make_bed: BedFactory) -> None:
    """Eight identical slice pods all bound before the kubelet admits the first (the classic
    double-allocation case; the scheduler's one-admission-per-node rule never does this): the
    plugin cannot tell them apart and refuses, handing nothing out. Once one pod is left
    waiting, it is served exactly."""
    async with make_bed() as bed:
        pods = [
            bed.pod(
                {"main": {CORE: 50, MEMORY: 50}},
                {"main": [DeviceShare(bed.gpu(i // 2), 50, 50)]},
                name=f"same-{i}",
            )
            for i in range(8)
        ]
        with pytest.raises(AdmissionError) as err:
            await bed.kubelet.admit(pods[0])
        message = str(err.value)
        assert "cannot tell which pod the kubelet is admitting" in message
        # The count, and the first names (a long list would drown the kubelet's event).
        assert "8 pods wait for devices (default/same-0, default/same-1," in message
        assert "and 3 more" in message
        assert await bed.allocations() == []
        bed.kubelet.free(pods[0]["metadata"]["uid"])
        for pod in pods[1:]:
            bed.pods.remove(pod["metadata"]["uid"])
        opts = (await bed.kubelet.admit(pods[0]))["main"]
        assert opts.envs["LJ_VISIBLE_DEVICES"] == bed.gpu(0)
        (alloc,) = await bed.allocations()
        assert alloc.pod_uid == pods[0]["metadata"]["uid"]


async def test_identical_slice_pods_admitted_in_any_order(make_bed: BedFactory) -> None:
    """With the kubelet's /pods a pod is listed from its admission on: identity is exact."""
    async with make_bed() as bed:
        pods = [
            bed.pod(
                {"main": {CORE: 40, MEMORY: 40}},
                {"main": [DeviceShare(bed.gpu(i), 40, 40)]},
                name=f"spread-{i}",
                listed=False,
            )
            for i in range(8)
        ]
        random.Random(7).shuffle(pods)  # the kubelet's order is not the scheduler's
        for pod in pods:
            opts = (await bed.kubelet.admit(pod))["main"]
            assigned = bed.gpu(int(pod["metadata"]["name"].split("-")[1]))
            assert opts.envs["LJ_VISIBLE_DEVICES"] == assigned
            assert opts.annotations["lingjun.com/pod-uid"] == pod["metadata"]["uid"]
        for a in await bed.allocations():
            pod = next(p for p in pods if p["metadata"]["uid"] == a.pod_uid)
            (d,) = a.devices
            assert d.device_id == bed.gpu(int(pod["metadata"]["name"].split("-")[1]))
