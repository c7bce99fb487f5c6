"""Exactly the kubelet's devices: what a container gets is the kubelet's IDs when they agree
with the assignment, else the call is refused saying why."""

from __future__ import annotations

import pytest

from lj_runtimekit.deviceplugin.internal.allocate.exact import resolve_call
from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held, Ledger
from lj_runtimekit.deviceplugin.internal.allocate.resolve import Waiting
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.rm.resources import ResourceInfo, resource_info
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import CORE, GPU, MEMORY

from .conftest import Parts, info


def _info(parts: Parts, name: str) -> ResourceInfo:
    found = resource_info(parts.protocol, name)
    assert found is not None
    return found


def test_the_kubelets_ids_within_the_assignment(parts: Parts) -> None:
    ledger = Ledger(parts.rm, parts.protocol)
    g = [parts.gpu(i) for i in range(3)]
    pod = info(parts.pod({"a": {GPU: 1}, "b": {GPU: 1}}, listed=False))
    w = Waiting(pod, {"a": (DeviceShare(g[0]),), "b": (DeviceShare(g[1]),)}, None)
    gpu = _info(parts, GPU)
    # Any device of the pod's pool: the kubelet may hand them out in its own order.
    container, part = resolve_call(w, gpu, [g[1]], ledger, parts.protocol, "n1")
    assert (container.name, part) == ("a", (DeviceShare(g[1]),))
    with pytest.raises(AllocationError, match="which the scheduler did not assign to the pod"):
        resolve_call(w, gpu, [g[2]], ledger, parts.protocol, "n1")
    ledger.entries[f"{pod.uid}/a"] = Held(
        f"{pod.uid}/a", pod.uid, "default", pod.name, "a", (DeviceShare(g[1]),), {GPU}
    )
    with pytest.raises(AllocationError, match="runs beside it already holds"):
        resolve_call(w, gpu, [g[1]], ledger, parts.protocol, "n1")


def test_slice_units_of_the_assigned_device_as_many_as_its_percentage(parts: Parts) -> None:
    ledger = Ledger(parts.rm, parts.protocol)
    share = DeviceShare(parts.gpu(2), 30, 20)
    pod = info(parts.pod({"main": {CORE: 30, MEMORY: 20}}, listed=False))
    w = Waiting(pod, {"main": (share,)}, None)
    core = _info(parts, CORE)
    units = list(parts.rm.snapshot.units(CORE, parts.gpu(2)))
    _, part = resolve_call(w, core, units[:30], ledger, parts.protocol, "n1")
    assert part == (share,)
    with pytest.raises(AllocationError, match="asks for 30"):
        resolve_call(w, core, units[:20], ledger, parts.protocol, "n1")
    other = list(parts.rm.snapshot.units(CORE, parts.gpu(4)))[:30]
    with pytest.raises(AllocationError, match=f"assigned it a slice of {parts.gpu(2)}"):
        resolve_call(w, core, other, ledger, parts.protocol, "n1")
    unplaced = Waiting(pod, None, None)
    with pytest.raises(AllocationError, match="was not placed by the Runtime Kit scheduler"):
        resolve_call(unplaced, core, units[:30], ledger, parts.protocol, "n1")
