"""GetPreferredAllocation's choices: the assignment's units not held by another container,
else the freest device's units; whole devices that carry no slice first."""

from __future__ import annotations

from lj_runtimekit.deviceplugin.internal.allocate import preferred
from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held, Ledger
from lj_runtimekit.deviceplugin.internal.allocate.resolve import Waiting
from lj_runtimekit.deviceplugin.internal.rm.resources import resource_info, slice_unit_device
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import CORE, GPU, MEMORY

from .conftest import Parts, info


def test_slice_units_not_held_come_first_then_the_freest_device(parts: Parts) -> None:
    ledger = Ledger(parts.rm, parts.protocol)
    core = resource_info(parts.protocol, CORE)
    assert core is not None
    units = list(parts.rm.snapshot.units(CORE, parts.gpu(3)))
    share = DeviceShare(parts.gpu(3), 20, 20)
    ledger.entries["x/main"] = Held("x/main", "x", "default", "x", "main", (share,), {CORE})
    ledger.entries["x/main"].units[CORE] = tuple(units[:20])
    pod = info(parts.pod({"main": {CORE: 20, MEMORY: 20}}, listed=False))
    waiting = Waiting(pod, {"main": (share,)}, None)
    creq = api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=units, allocation_size=20
    )
    chosen = preferred.assigned(core, waiting, set(), creq, ledger, parts.rm)
    assert chosen is not None
    assert not set(chosen) & set(units[:20])
    # Fewer units of the assigned device than asked: no preference from the assignment; the
    # fallback takes the device with the most units available.
    creq.available_deviceIDs[:] = units[:10] + list(parts.rm.snapshot.units(CORE, parts.gpu(5)))
    assert preferred.assigned(core, waiting, set(), creq, ledger, parts.rm) is None
    got = preferred.fallback(core, list(creq.available_deviceIDs), [], 20, ledger, parts.rm)
    assert {slice_unit_device(u) for u in got} == {parts.gpu(5)}


def test_whole_fallback_prefers_devices_without_slices(parts: Parts) -> None:
    ledger = Ledger(parts.rm, parts.protocol)
    gpu = resource_info(parts.protocol, GPU)
    assert gpu is not None
    share = DeviceShare(parts.gpu(0), 30, 30)
    ledger.entries["x/main"] = Held("x/main", "x", "default", "x", "main", (share,), {CORE})
    got = preferred.fallback(gpu, [parts.gpu(0), parts.gpu(1)], [], 1, ledger, parts.rm)
    assert got == [parts.gpu(1)]
