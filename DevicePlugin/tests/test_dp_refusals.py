"""Refusals: the refused pods are remembered (bounded); a call is tied to one waiting pod or
refused with what the plugin saw."""

from __future__ import annotations

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.allocate.refusals import RefusedPods, one_pod
from lj_runtimekit.deviceplugin.internal.allocate.resolve import Waiting
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.testkit.podserver import pod_object

from .conftest import info


def _waiting(n: int) -> list[Waiting]:
    return [Waiting(info(pod_object(f"p{i}", {"c": {}})), None, None) for i in range(n)]


def test_refused_pods_are_remembered_oldest_dropped_first() -> None:
    refused = RefusedPods(limit=2)
    pods = [w.pod for w in _waiting(3)]
    for pod in pods:
        refused.add(pod)
    assert [p.uid in refused for p in pods] == [False, True, True]


def test_one_pod_or_a_refusal_naming_what_was_seen() -> None:
    (only,) = _waiting(1)
    assert one_pod([only], "n1", "r", 1, "the kubelet's pod list") is only
    with pytest.raises(AllocationError) as err:
        one_pod([], "n1", "r", 2, "the kubelet's pod list")
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.message.startswith(
        "no pod on node n1 waits for devices in the kubelet's pod list, yet the kubelet asks"
        " for 2 of r"
    )
    with pytest.raises(AllocationError) as err:
        one_pod(_waiting(7), "n1", "r", 1, "the API server's pod list")
    assert "7 pods wait for devices (default/p0, default/p1, default/p2, default/p3," in (
        err.value.message
    )
    assert "default/p4 and 2 more) in the API server's pod list;" in err.value.message
