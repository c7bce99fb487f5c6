"""The Runtime's Allocate for a container: its spec as the kubelet's answer, its refusal
passed through with the Runtime's code."""

from __future__ import annotations

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.allocate.runtime import (
    container_response,
    runtime_allocate,
)
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import CORE, MEMORY

from .conftest import Parts, info


async def test_spec_answered_and_refusal_passed_through(parts: Parts) -> None:
    first = info(parts.pod({"main": {CORE: 60, MEMORY: 60}}, listed=False))
    (main,) = first.containers
    share = DeviceShare(parts.gpu(1), 60, 60)
    answer = container_response((await runtime_allocate(parts.runtime, first, main, (share,))).spec)
    assert answer.envs["LJ_VISIBLE_DEVICES"] == parts.gpu(1)
    assert answer.annotations["lingjun.com/container-key"] == f"{first.uid}/main"
    second = info(parts.pod({"main": {CORE: 60, MEMORY: 60}}, listed=False))
    with pytest.raises(AllocationError) as err:
        await runtime_allocate(parts.runtime, second, second.containers[0], (share,))
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.message.startswith(
        f"Runtime refused {parts.gpu(1)}(60% core, 60% memory) for pod default/pod-2"
    )
