"""Eight pending pods with identical slice requests on one node: all admitted, records true."""

from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from collections.abc import Callable

from lj_runtimekit.deviceplugin.internal.kubeletshim.bed import CORE, MEMORY, Bed
from lj_runtimekit.proto.pkg.protocol import DeviceShare

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]


async def test_eight_identical_slice_pods(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        # The scheduler packs two 50 % pods per device on devices 0..3, all bound before
        # the kubelet admits the first (the ambiguous case of the anchors).
        pods = [
            bed.pod(
                {"main": {CORE: 50, MEMORY: 50}},
                {"main": [DeviceShare(bed.gpu(i // 2), 50, 50)]},
                name=f"same-{i}",
            )
            for i in range(8)
        ]
        for pod in pods:  # the kubelet admits them one at a time, in the order it got them
            opts = (await bed.kubelet.admit(pod))["main"]
            want = pod["metadata"]["annotations"]
            assigned = bed.gpu(int(pod["metadata"]["name"].split("-")[1]) // 2)
            assert opts.envs["LJ_VISIBLE_DEVICES"] == assigned, want
            assert opts.annotations["lingjun.com/pod-name"] == pod["metadata"]["name"]
            assert opts.annotations["lingjun.com/pod-uid"] == pod["metadata"]["uid"]
            assert {u.rpartition("::")[0] for u in opts.device_ids[CORE]} == {assigned}

        allocations = await bed.allocations()
        assert sorted(a.container_key for a in allocations) == sorted(
            f"{p['metadata']['uid']}/main" for p in pods
        )
        core: dict[str, int] = defaultdict(int)
        memory: dict[str, int] = defaultdict(int)
        for a in allocations:
            pod = next(p for p in pods if p["metadata"]["uid"] == a.pod_uid)
            (d,) = a.devices
            assert d.device_id == bed.gpu(int(pod["metadata"]["name"].split("-")[1]) // 2)
            core[d.device_id] += d.core_percent
            memory[d.device_id] += d.memory_percent
        assert max(core.values()) <= 100
        assert max(memory.values()) <= 100
        assert len(core) == 4
        # The kubelet's own unit accounting matches the physical placement.
        used = bed.kubelet.in_use[CORE]
        assert len(used) == 400
        assert {u.rpartition("::")[0] for u in used} == {bed.gpu(i) for i in range(4)}


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
