"""The cross-check: the kubelet's PodResources record against the ledger, a difference
reported once two rounds in a row show it."""

from __future__ import annotations

import logging

import pytest

from lj_runtimekit.deviceplugin.internal.allocate.crosscheck import CrossCheck
from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held, Ledger
from lj_runtimekit.deviceplugin.internal.podresources.check import PodResourcesClient
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import GPU

from .conftest import KubeletPodResources, Parts, info


async def test_a_difference_is_reported_once_it_lasts_two_rounds(
    parts: Parts,
    pod_resources: tuple[KubeletPodResources, PodResourcesClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    kubelet, client = pod_resources
    ledger = Ledger(parts.rm, parts.protocol)
    pod = info(parts.pod({"main": {GPU: 1}}, name="p"))
    ledger.entries[f"{pod.uid}/main"] = Held(
        f"{pod.uid}/main", pod.uid, "default", "p", "main", (DeviceShare(parts.gpu(1)),), {GPU}
    )
    check = CrossCheck(client, ledger, parts.rm, parts.protocol)
    kubelet.listed = _listed(parts.gpu(2))
    caplog.set_level(logging.WARNING)
    (diff,) = await check.run([pod])
    assert (diff.pod, diff.container, diff.kubelet, diff.served) == (
        "default/p",
        "main",
        (parts.gpu(2),),
        parts.gpu(1),
    )
    assert "kubelet record differs" not in caplog.text
    await check.run([pod])
    await check.run([pod])
    assert caplog.text.count("kubelet record differs") == 1
    kubelet.listed = _listed(parts.gpu(1))
    assert await check.run([pod]) == []
    assert await CrossCheck(None, ledger, parts.rm, parts.protocol).run([pod]) == []


def _listed(device: str) -> prpb.ListPodResourcesResponse:
    """The kubelet's record: pod default/p container main holds `device`."""
    devices = prpb.ContainerDevices(resource_name=GPU, device_ids=[device])
    container = prpb.ContainerResources(name="main", devices=[devices])
    return prpb.ListPodResourcesResponse(
        pod_resources=[prpb.PodResources(namespace="default", name="p", containers=[container])]
    )
