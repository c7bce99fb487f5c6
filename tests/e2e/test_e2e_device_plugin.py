"""The Device Plugin's answers as the real kubelet records them: every running container
was injected its own container key and devices (the device manager's checkpoint holds
each Allocate answer), never a neighbour's, and never a deleted namesake's call."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.proto.pkg.protocol import BIND_PHASE_ALLOCATING, DeviceShare, encode_assignment
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient
from lj_runtimekit.sandbox import Sandbox, workload
from lj_runtimekit.sandbox.bed import NodeHandle
from lj_runtimekit.sandbox.workload import pod_manifest
from lj_runtimekit.testkit.invariant import KubeletSpec, checkpoint_specs, foreign_specs
from lj_runtimekit.testkit.waits import NotYet, wait_for

from .conftest import make_bed

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

BED_KINDS = ("tdm-8gpu",)


@pytest.fixture(scope="module", params=["kubelet-pods", "api-watch"])
def bed(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """One node; its Device Plugin reads the kubelet's /pods, or (port 10255 closed) one
    API server watch of the node's pods."""
    yield from make_bed(BED_KINDS, request.session, read_only_port=request.param == "kubelet-pods")


def _gpus(node: NodeHandle) -> list[str]:
    async def listed() -> list[str]:
        async with RuntimeClient(node.sim_dir, retry=RetryPolicy(attempts=3)) as client:
            return [d.id for d in sorted(await client.list_devices(), key=lambda d: d.index)]

    return asyncio.run(listed())


def _specs(node: NodeHandle) -> list[KubeletSpec]:
    return checkpoint_specs((node.plugin_dir / "kubelet_internal_checkpoint").read_text())


def _placed(bed: Sandbox, name: str, share: DeviceShare) -> dict[str, Any]:
    """A slice pod on the node with this assignment, bound around the scheduler (as when the
    scheduler's count of the device is below the kubelet's)."""
    res, ann = bed.protocol.resources, bed.protocol.annotations
    pod = pod_manifest(
        name,
        {"main": {res.core: share.core_percent, res.memory: share.memory_percent}},
        annotations={
            ann.assigned_devices: encode_assignment({"main": (share,)}),
            ann.bind_phase: BIND_PHASE_ALLOCATING,
        },
    )
    pod["spec"]["nodeName"] = bed.nodes[0].name
    del pod["spec"]["schedulerName"]
    return pod


def _phase(api: k8s_client.ApiClient, ns: str, name: str) -> tuple[str, str]:
    status = k8s_client.CoreV1Api(api).read_namespaced_pod(name, ns).status
    return status.phase or "", f"{status.reason or ''}: {status.message or ''}"


def _settle(api: k8s_client.ApiClient, ns: str, name: str) -> tuple[str, str]:
    def check() -> tuple[str, str] | NotYet:
        got = _phase(api, ns, name)
        return got if got[0] in ("Running", "Failed") else NotYet(str(got))

    return wait_for(check, 90, f"pod {name} Running or Failed")


def test_a_pod_the_kubelet_cannot_give_its_units_gets_no_neighbours_spec(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """The kubelet holds more units of a GPU than the pod's assignment leaves free: it
    cannot take the assigned units, and passes units of the freest GPU, where a running
    slice of the same size holds the rest. The pod is refused (the kubelet fails it with
    the plugin's reason), and every running container was injected its own container key
    and devices."""
    node = bed.nodes[0]
    gpus = _gpus(node)
    pods = [_placed(bed, "neighbour", DeviceShare(gpus[0], 50, 50))]
    pods += [_placed(bed, f"filler-{i}", DeviceShare(gpus[i], 60, 60)) for i in range(1, 8)]
    for pod in pods:
        workload.create_pods(api, ns, [pod])
        name = pod["metadata"]["name"]
        assert _settle(api, ns, name)[0] == "Running", _phase(api, ns, name)
    # 60 % of GPU 1 held: 40 units left there, 50 on GPU 0, 40 on every other.
    workload.create_pods(api, ns, [_placed(bed, "squeezed", DeviceShare(gpus[1], 50, 50))])
    phase, reason = _settle(api, ns, "squeezed")
    listed = workload.list_pods(api, ns)
    specs = _specs(node)
    assert foreign_specs(specs, listed, bed.protocol) == []
    assert phase == "Failed", reason
    assert reason.startswith("UnexpectedAdmissionError"), reason
    assert f"the scheduler assigned it a slice of {gpus[1]}" in reason, reason
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in listed}
    neighbour = [s for s in specs if s.pod_uid == uids["neighbour"]]
    assert {s.envs["LJ_VISIBLE_DEVICES"] for s in neighbour} == {gpus[0]}


def test_a_pod_recreated_under_its_name_is_never_served_the_deleted_ones_call(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """The kubelet (stopped meanwhile) still admits a pod the API server has deleted, while
    a pod of the same name (a StatefulSet's, created again) is bound to the node: the
    deleted pod's call is never served as the new pod's. The new pod runs with its own
    container key, or is refused naming both UIDs (where its call came first)."""
    res = bed.protocol.resources
    core = k8s_client.CoreV1Api(api)
    node = bed.nodes[0]
    pin = {"kubernetes.io/hostname": node.name}
    kubelet_pid = node.kubelet.process.pid
    assert kubelet_pid is not None
    os.kill(kubelet_pid, signal.SIGSTOP)
    try:
        workload.create_pods(
            api, ns, [pod_manifest("same", {"main": {res.gpu: 1}}, node_selector=pin)]
        )
        old = wait_for(lambda: _bound_uid(core, ns, "same"), 60, "the first pod bound")
        core.delete_namespaced_pod("same", ns, grace_period_seconds=0)
        wait_for(lambda: _bound_uid(core, ns, "same") is None, 30, "the first pod gone")
        workload.create_pods(
            api, ns, [pod_manifest("same", {"main": {res.gpu: 1}}, node_selector=pin)]
        )
        new = wait_for(lambda: _bound_uid(core, ns, "same"), 60, "the second pod bound")
    finally:
        os.kill(kubelet_pid, signal.SIGCONT)
    assert new != old
    phase, reason = _settle(api, ns, "same")
    repeated = [
        line
        for line in node.plugin.log_path.read_text().splitlines()
        if "repeated Allocate answered again" in line and f"pod={ns}/same " in line
    ]
    assert repeated == []
    if phase == "Running":
        keys = {s.annotations.get("lingjun.com/container-key") for s in _specs(node)}
        assert keys == {f"{new}/main"}
    else:
        assert f"(UID {new}) or the pod of the same name" in reason, reason


def _bound_uid(core: k8s_client.CoreV1Api, ns: str, name: str) -> str | None:
    try:
        pod = core.read_namespaced_pod(name, ns)
    except k8s_client.ApiException:
        return None
    return str(pod.metadata.uid) if pod.spec.node_name else None
