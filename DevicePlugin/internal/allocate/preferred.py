"""GetPreferredAllocation: the assigned devices of the pod in admission, else topology.

For a slice the plugin prefers units no container it holds was given. The
kubelet may offer them again: its device manager rebuilds its set of
allocated IDs from its per-pod record whenever a PodResources `List` finds a
pod to forget, and a container whose Allocate call is under way at that
moment is not in that record yet, so its IDs read as free until the next
rebuild. Preferring other units keeps two containers from recording the same
unit (the Runtime's percentages are right either way; the kubelet's record
and what reads it would not be).
"""

from __future__ import annotations

from lj_runtimekit.deviceplugin.internal.allocate.exact import pool
from lj_runtimekit.deviceplugin.internal.allocate.ledger import Ledger
from lj_runtimekit.deviceplugin.internal.allocate.resolve import DoneKey, Waiting, next_container
from lj_runtimekit.deviceplugin.internal.allocate.topology import best_set
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager
from lj_runtimekit.deviceplugin.internal.rm.resources import (
    ResourceInfo,
    ResourceKind,
    slice_unit_device,
)
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2


def assigned(
    info: ResourceInfo,
    waiting: Waiting,
    done: set[DoneKey],
    creq: api_pb2.ContainerPreferredAllocationRequest,
    ledger: Ledger,
    rm: ResourceManager,
) -> list[str] | None:
    """The next container's assigned IDs the kubelet can give, or None."""
    pod, assignment = waiting.pod, waiting.assignment
    container = next_container(pod, info.name, done)
    if container is None or assignment is None:
        return None
    size = creq.allocation_size
    available = set(creq.available_deviceIDs)
    must = list(creq.must_include_deviceIDs)
    own = assignment.get(container.name, ())
    if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
        sliced = [s.device_id for s in own if not s.whole]
        if len(sliced) != 1:
            return None
        units = rm.snapshot.units(info.name, sliced[0])
        held = ledger.held_units(info.name)
        free = [u for u in units if u not in must and u in available]
        chosen = [*must, *sorted(free, key=lambda u: u in held)]
    else:
        whole = pool(assignment, info, ledger)
        clash = ledger.clash_set(pod, container)
        ranked = [s.device_id for s in own if s.device_id in whole] + sorted(whole)
        chosen = [*must, *(d for d in dict.fromkeys(ranked) if d not in must)]
        chosen = [d for d in chosen if d in must or (d in available and d not in clash)]
    return chosen[:size] if len(chosen) >= size else None


def fallback(
    info: ResourceInfo,
    available: list[str],
    must: list[str],
    size: int,
    ledger: Ledger,
    rm: ResourceManager,
) -> list[str]:
    """Without a usable assignment: topology for whole devices (those carrying no slice
    first), the freest device's units (not held ones first) for slices."""
    if info.kind == ResourceKind.WHOLE:
        devices = {d.id: d for d in rm.snapshot.devices}
        busy = ledger.busy()
        unsliced = [d for d in available if d not in busy]
        candidates = unsliced if len(set(unsliced) | set(must)) >= size else available
        return best_set(candidates, must, size, devices)
    if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
        counts: dict[str | None, int] = {}
        for u in available:
            counts[slice_unit_device(u)] = counts.get(slice_unit_device(u), 0) + 1
        held = ledger.held_units(info.name)
        ranked = sorted(
            (u for u in available if u not in must),
            key=lambda u: (-counts[slice_unit_device(u)], u in held, u),
        )
        return [*must, *ranked][:size]
    return [*must, *(d for d in available if d not in must)][:size]
