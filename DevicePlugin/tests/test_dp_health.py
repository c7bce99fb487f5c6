"""Health on ListAndWatch: a device goes Unhealthy and back, the Runtime socket restarts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import CORE, GPU, MEMORY, RES, Bed

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]


def health(bed: Bed, resource: str, ids: list[str]) -> set[str]:
    devices = bed.kubelet.devices(resource)
    return {devices[i].health for i in ids}


async def test_device_unhealthy_and_back(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        sick = bed.gpu(2)
        units = [f"{sick}::{n}" for n in range(100)]
        start = time.monotonic()
        bed.sim.set_health(sick, healthy=False, reason="XID 79")
        await bed.kubelet.wait_for(
            lambda: (
                health(bed, GPU, [sick]) == {"Unhealthy"}
                and health(bed, CORE, units) == {"Unhealthy"}
                and health(bed, MEMORY, units) == {"Unhealthy"}
            ),
            5,
        )
        assert time.monotonic() - start <= 1.0, bed.fail("health took more than 1 s")
        others = [bed.gpu(i) for i in range(8) if i != 2]
        assert health(bed, GPU, others) == {"Healthy"}
        assert len(bed.kubelet.devices(GPU)) == 8  # listed, not missing
        bed.sim.set_health(sick, healthy=True)
        await bed.kubelet.wait_for(
            lambda: (
                health(bed, GPU, [sick]) == {"Healthy"} and health(bed, CORE, units) == {"Healthy"}
            ),
            5,
        )


async def test_mig_instance_unhealthy_and_back(make_bed: BedFactory) -> None:
    mig = RES.mig("1g.10gb")
    async with make_bed("mig-8gpu", wait_for=(GPU, mig)) as bed:
        instance = next(m.id for d in bed.devices for m in d.mig_instances)
        bed.sim.set_health(instance, healthy=False, reason="ECC")
        await bed.kubelet.wait_for(lambda: health(bed, mig, [instance]) == {"Unhealthy"}, 5)
        bed.sim.set_health(instance, healthy=True)
        await bed.kubelet.wait_for(lambda: health(bed, mig, [instance]) == {"Healthy"}, 5)


async def test_runtime_socket_restart_marks_unhealthy_then_recovers(
    make_bed: BedFactory,
) -> None:
    async with make_bed() as bed:
        every = [bed.gpu(i) for i in range(8)]
        bed.sim.restart_socket(down_ms=1500, wait=False)
        await bed.kubelet.wait_for(lambda: health(bed, GPU, every) == {"Unhealthy"}, 5)
        assert len(bed.kubelet.devices(CORE)) == 800  # Unhealthy, not missing
        await bed.kubelet.wait_for(lambda: health(bed, GPU, every) == {"Healthy"}, 10)
        await bed.kubelet.wait_for(
            lambda: {d.health for d in bed.kubelet.devices(CORE).values()} == {"Healthy"}, 5
        )
        # Allocation works again on the renewed Runtime channel.
        pod = bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(4))]})
        opts = (await bed.kubelet.admit(pod))["main"]
        assert opts.envs["LJ_VISIBLE_DEVICES"] == bed.gpu(4)
        assert "runtime lost, devices unhealthy" in bed.plugin.log()


async def test_runtime_upgrade_and_downgrade_reevaluate_the_gates(make_bed: BedFactory) -> None:
    mig = RES.mig("1g.10gb")
    async with make_bed("mig-8gpu", version="v1.13.0") as bed:
        assert mig not in bed.kubelet.plugins
        bed.sim.set_version("v1.14.0")
        bed.sim.restart_socket(down_ms=300)
        # The MIG gate opens: its resources get endpoints and register, nothing restarts.
        await bed.kubelet.wait_registered((mig,), 10)
        assert len(bed.kubelet.devices(mig)) == 7
        assert "runtime version changed from=v1.13.0 to=v1.14.0" in bed.plugin.log()
        bed.sim.set_version("v1.12.0")
        bed.sim.restart_socket(down_ms=300)
        await bed.kubelet.wait_for(
            lambda: bed.plugin.log().count("runtime version changed") == 2, 10
        )
        await bed.kubelet.wait_for(
            lambda: {d.health for d in bed.kubelet.devices(GPU).values()} == {"Unhealthy"}, 10
        )
        assert "needs Runtime v1.13.0 or newer" in bed.plugin.log()
