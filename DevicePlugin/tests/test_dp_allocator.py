"""The allocator (Allocate end to end over its parts): the pod in admission gets exactly its
own devices; a repeated call is answered again only for the container that holds exactly
the kubelet's IDs, and never while a pod waits for the call's resource."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.allocate.allocator import Allocator
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import CORE, GPU, MEMORY

from .conftest import Parts, allocate_request


async def call(allocator: Allocator, resource: str, ids: list[str]) -> dict[str, str]:
    """One kubelet Allocate for one container; the envs it answers."""
    response = await allocator.allocate(resource, allocate_request(ids))
    return dict(response.container_responses[0].envs)


async def keys(parts: Parts) -> list[str]:
    return sorted(a.container_key for a in await parts.runtime.client.list_allocations())


async def admit_slice(
    parts: Parts, allocator: Allocator, device: int, percent: int, first_unit: int = 0
) -> tuple[dict[str, Any], list[str]]:
    """A slice pod on GPU `device`, admitted on units first_unit.. of it."""
    gpu = parts.gpu(device)
    pod = parts.pod(
        {"main": {CORE: percent, MEMORY: percent}},
        {"main": [DeviceShare(gpu, percent, percent)]},
    )
    units = list(parts.rm.snapshot.units(CORE, gpu))[first_unit : first_unit + percent]
    await call(allocator, CORE, units)
    memory = list(parts.rm.snapshot.units(MEMORY, gpu))[first_unit : first_unit + percent]
    await call(allocator, MEMORY, memory)
    return pod, units


async def test_a_waiting_pod_is_never_answered_with_a_neighbours_spec(parts: Parts) -> None:
    """The kubelet cannot take the waiting pod's assigned units and passes free units of a
    device a running slice holds (its freest): the call is refused, not answered with the
    running container's spec (its key, its devices)."""
    allocator = parts.allocator()
    neighbour, _ = await admit_slice(parts, allocator, 0, 50)
    waiting = parts.pod(
        {"main": {CORE: 50, MEMORY: 50}}, {"main": [DeviceShare(parts.gpu(3), 50, 50)]}
    )
    others = list(parts.rm.snapshot.units(CORE, parts.gpu(0)))[50:]
    with pytest.raises(AllocationError) as err:
        await call(allocator, CORE, others)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"the scheduler assigned it a slice of {parts.gpu(3)}" in err.value.message
    assert f"pod default/{waiting['metadata']['name']}" in err.value.message
    assert await keys(parts) == [f"{neighbour['metadata']['uid']}/main"]


async def test_a_repeated_call_needs_exactly_the_units_held(parts: Parts) -> None:
    """No pod waits: the kubelet asking again for a running slice's exact units gets its spec
    again; other units of the same device, as many, are refused."""
    allocator = parts.allocator()
    pod, units = await admit_slice(parts, allocator, 0, 50)
    again = await call(allocator, CORE, units)
    assert again["LJ_VISIBLE_DEVICES"] == parts.gpu(0)
    others = list(parts.rm.snapshot.units(CORE, parts.gpu(0)))[50:]
    with pytest.raises(AllocationError) as err:
        await call(allocator, CORE, others)
    assert "no pod on node node-1 waits for devices" in err.value.message
    assert await keys(parts) == [f"{pod['metadata']['uid']}/main"]


async def test_no_repeated_call_while_a_pod_waits_for_the_resource(parts: Parts) -> None:
    """While a pod waits for the call's resource the call may be its own: even the exact
    devices a running container holds are refused for it (whole devices and slices)."""
    allocator = parts.allocator()
    whole = parts.pod({"main": {GPU: 1}}, {"main": [DeviceShare(parts.gpu(1))]})
    await call(allocator, GPU, [parts.gpu(1)])
    _, units = await admit_slice(parts, allocator, 0, 50)
    parts.pod({"main": {GPU: 1}}, {"main": [DeviceShare(parts.gpu(2))]}, name="next-whole")
    with pytest.raises(AllocationError) as err:
        await call(allocator, GPU, [parts.gpu(1)])
    assert "which the scheduler did not assign to the pod" in err.value.message
    parts.pod(
        {"main": {CORE: 50, MEMORY: 50}},
        {"main": [DeviceShare(parts.gpu(4), 50, 50)]},
        name="next-slice",
    )
    with pytest.raises(AllocationError):
        await call(allocator, CORE, units)
    assert f"{whole['metadata']['uid']}/main" in await keys(parts)
    assert len(await keys(parts)) == 2
