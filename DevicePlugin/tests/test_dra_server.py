"""The kubelet's side of the plugin's sockets: Registration on
`<kubelet dir>/plugins_registry/<driver>-reg.sock`, DRAPlugin v1 and v1beta1 on
`<kubelet dir>/plugins/<driver>/dra.sock`, over real unix sockets, with the Runtime
simulator and claims on a DRA-gated API server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.dra.claims import ClaimRef
from lj_runtimekit.deviceplugin.internal.dra.prepare import container_key
from lj_runtimekit.deviceplugin.internal.dra.server import PluginServers
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2 as v1
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2_grpc as v1_grpc
from lj_runtimekit.proto.k8s.dra.v1beta1 import api_pb2 as v1beta1
from lj_runtimekit.proto.k8s.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2 as reg
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2_grpc as reg_grpc

from . import test_dra_prepare as bed
from .test_dra_prepare import DRIVER, GIB, POOL, Node, result, write_claim

pytestmark = pytest.mark.controlplane
# the control plane, namespace and node fixtures of the prepare tests, for this module
dra_cp, kube, ns, node = bed.dra_cp, bed.kube, bed.ns, bed.node


@pytest.fixture
async def served(node: Node, workdir: Path) -> AsyncIterator[PluginServers]:
    """The plugin's servers over a started preparer, in `<workdir>/kubelet`."""
    preparer = node.preparer()
    await preparer.reconcile()
    servers = PluginServers(workdir / "kubelet", DRIVER, preparer)
    # stale sockets of an earlier run are replaced
    for path in (servers.service_path, servers.registration_path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("stale")
    await servers.start()
    try:
        yield servers
    finally:
        await servers.stop(0)


def claim(ref: ClaimRef) -> v1.Claim:
    """The kubelet's Claim message of a claim."""
    return v1.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)


async def test_registration_names_the_service_socket(
    served: PluginServers, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = workdir / "kubelet"
    assert served.registration_path == kubelet / "plugins_registry" / f"{DRIVER}-reg.sock"
    assert served.service_path == kubelet / "plugins" / DRIVER / "dra.sock"
    async with grpc.aio.insecure_channel(f"unix:{served.registration_path}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            DRIVER,
            str(served.service_path),
        )
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        with caplog.at_level(logging.ERROR):
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=False, error="driver name taken"),
                timeout=5,
            )
    assert served.registration.registered is False
    [refusal] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert refusal.getMessage() == "the kubelet refused the registration"
    assert refusal.__dict__["reason"] == "driver name taken"

    await served.stop(0)
    assert not served.service_path.exists()
    assert not served.registration_path.exists()


async def test_v1_and_v1beta1_prepare_and_unprepare(
    served: PluginServers, node: Node, ns: str
) -> None:
    good = write_claim(node.kube, ns, "good", [result("gpu-0", "train")], requests=("train",))
    stale = write_claim(node.kube, ns, "stale", [result("gpu-1")])
    node.kube.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/stale")
    async with grpc.aio.insecure_channel(f"unix:{served.service_path}") as channel:
        stub_v1 = v1_grpc.DRAPluginStub(channel)
        stub_beta = v1beta1_grpc.DRAPluginStub(channel)
        answer = await stub_v1.NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[claim(good), claim(stale)]), timeout=45
        )
        assert set(answer.claims) == {good.uid, stale.uid}
        assert answer.claims[stale.uid].error == f"{stale} not found on the API server"
        prepared = answer.claims[good.uid]
        assert prepared.error == ""
        assert [
            (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in prepared.devices
        ] == [(["train"], POOL, "gpu-0", [f"{DRIVER}/claim={good.uid}"])]

        beta = await stub_beta.NodePrepareResources(
            v1beta1.NodePrepareResourcesRequest(
                claims=[v1beta1.Claim(namespace=ns, name="good", uid=good.uid)]
            ),
            timeout=45,
        )
        assert beta.claims[good.uid].SerializeToString() == prepared.SerializeToString()
        assert list(node.held()) == [container_key(good.uid)]

        gone = await stub_beta.NodeUnprepareResources(
            v1beta1.NodeUnprepareResourcesRequest(
                claims=[v1beta1.Claim(namespace=ns, name="good", uid=good.uid)]
            ),
            timeout=45,
        )
        assert gone.claims[good.uid].error == ""
        assert node.held() == {}
        assert node.specs() == []
        unknown = await stub_v1.NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest(claims=[claim(stale)]), timeout=45
        )
        assert set(unknown.claims) == {stale.uid}
        assert unknown.claims[stale.uid].error == ""


async def test_prepare_repeated_after_the_kubelet_gave_up(
    served: PluginServers, node: Node, ns: str
) -> None:
    ref = write_claim(node.kube, ns, "slow", [result("gpu-2")])
    node.sim.faults.set_latency(800)  # every Runtime call
    request = v1.NodePrepareResourcesRequest(claims=[claim(ref)])
    async with grpc.aio.insecure_channel(f"unix:{served.service_path}") as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as timed_out:
            await stub.NodePrepareResources(request, timeout=0.5)
        assert timed_out.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        again = await stub.NodePrepareResources(request, timeout=45)
    assert again.claims[ref.uid].error == ""
    assert [d.device_name for d in again.claims[ref.uid].devices] == ["gpu-2"]
    assert list(node.held()) == [container_key(ref.uid)]
    assert len(node.specs()) == 1


async def test_a_share_is_answered_with_its_share_id(
    served: PluginServers, node: Node, ns: str
) -> None:
    shared = result("gpu-1", "share", consumed={"cores": "30", "memory": f"{20 * GIB}"})
    share = write_claim(node.kube, ns, "share", [shared], requests=("share",))
    whole = write_claim(node.kube, ns, "whole", [result("gpu-2")])
    async with grpc.aio.insecure_channel(f"unix:{served.service_path}") as channel:
        answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[claim(share), claim(whole)]), timeout=45
        )
    ((device,),) = [answer.claims[share.uid].devices]
    assert device.share_id == shared["shareID"]
    ((device,),) = [answer.claims[whole.uid].devices]
    assert not device.HasField("share_id")
