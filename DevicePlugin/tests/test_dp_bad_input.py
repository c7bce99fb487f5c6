"""Every bad input is a gRPC error with a clear message; the plugin keeps serving."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import grpc
import pytest

from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import ANN, CORE, GPU, MEMORY, Bed

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]


async def refused(bed: Bed, resource: str, ids: Sequence[str]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await bed.kubelet.allocate(resource, [list(ids)])
    return err.value.code(), err.value.details() or ""


async def still_serves(bed: Bed, index: int) -> None:
    pod = bed.pod({"ok": {GPU: 1}}, {"ok": [DeviceShare(bed.gpu(index))]})
    opts = (await bed.kubelet.admit(pod))["ok"]
    assert opts.envs["LJ_VISIBLE_DEVICES"] == bed.gpu(index)
    assert bed.plugin.running


async def test_bad_requests_are_refused_clearly(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        code, msg = await refused(bed, GPU, ["GPU-nope"])
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device IDs GPU-nope" in msg

        units = [f"{bed.gpu(0)}::{n}" for n in range(100)] + [f"{bed.gpu(1)}::0"]
        code, msg = await refused(bed, CORE, units)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "asks for 101 units" in msg

        code, msg = await refused(bed, GPU, [bed.gpu(0), bed.gpu(0)])
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "more than once" in msg

        code, msg = await refused(bed, GPU, [bed.gpu(0)])
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pod on node" in msg
        await still_serves(bed, 7)


async def test_slice_pod_without_assignment(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        pod = bed.pod({"main": {CORE: 20, MEMORY: 20}}, name="no-assignment")
        code, msg = await refused(bed, CORE, [f"{bed.gpu(0)}::{n}" for n in range(20)])
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert f"pod default/no-assignment container main asks for 20 of {CORE}" in msg
        assert f"carries no {ANN.assigned_devices} annotation" in msg
        bed.pods.remove(pod["metadata"]["uid"])
        await still_serves(bed, 0)


MALFORMED = [
    ("{not json", "not valid JSON"),
    ('{"main": [{"id": "x", "core": 150, "memory": 10}]}', "must be an integer 0..100"),
    ('{"other": [{"id": "x"}]}', "has no entry for container main"),
]


async def test_malformed_assignment(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        for n, (raw, expected) in enumerate(MALFORMED):
            pod = bed.pod({"main": {GPU: 1}}, raw_assignment=raw, name=f"bad-{n}")
            code, msg = await refused(bed, GPU, [bed.gpu(0)])
            assert code == grpc.StatusCode.FAILED_PRECONDITION, msg
            assert f"annotation {ANN.assigned_devices} of pod default/bad-{n}" in msg
            assert expected in msg
            bed.pods.remove(pod["metadata"]["uid"])
            await still_serves(bed, n + 1)


async def test_assignment_disagreeing_with_the_request(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        bed.pod({"main": {CORE: 40, MEMORY: 40}}, {"main": [DeviceShare(bed.gpu(0), 30, 40)]})
        code, msg = await refused(bed, CORE, [f"{bed.gpu(0)}::{n}" for n in range(40)])
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "gives it 30% core" in msg


async def test_runtime_refusal_and_runtime_errors(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        first = bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(3))]})
        await bed.kubelet.admit(first)
        # A scheduler bug: the same whole device assigned twice. The Runtime refuses.
        bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(3))]}, name="twice")
        code, msg = await refused(bed, GPU, [bed.gpu(3)])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "Runtime refused" in msg
        assert "pod default/twice" in msg
        assert "held whole" in msg
        # The Runtime fails every call: UNAVAILABLE, after the client's bounded retries.
        bed.sim.set_error_rate(1.0)
        code, msg = await refused(bed, GPU, [bed.gpu(3)])
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "simulated Runtime failure" in msg
        bed.sim.set_error_rate(0.0)
        # Nothing lost: the refused pod is still pending and is served once fixed.
        (twice,) = [p for p in bed.pods.pods() if p["metadata"]["name"] == "twice"]
        bed.pods.remove(twice["metadata"]["uid"])
        await still_serves(bed, 5)
        keys = {a.container_key for a in await bed.allocations()}
        assert f"{first['metadata']['uid']}/main" in keys


async def test_pod_list_unavailable(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        bed.pod({"main": {GPU: 1}}, {"main": [DeviceShare(bed.gpu(0))]})
        bed.pods.stop()
        code, msg = await refused(bed, GPU, [bed.gpu(0)])
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "cannot list the node's pods" in msg
        assert "no API server access" in msg
        await refused(bed, GPU, [bed.gpu(0)])
        assert bed.plugin.log().count("reading the node's pods from the API server") == 1
