"""The beds of end-to-end tests, one per module: the sandbox (`bed`), and a DRA control plane
with KWOK nodes publishing the driver's slices (`dra_cluster`, `dra_space`)."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes
from lj_runtimekit.deviceplugin.internal.dra.publisher import server_minor
from lj_runtimekit.deviceplugin.internal.dra.slices import build_slices, counters_apart
from lj_runtimekit.envtest import NodeFactory, ToolsMissingError, find_tools
from lj_runtimekit.envtest.controlplane import (
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    dra_gates,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, load_protocol
from lj_runtimekit.sandbox import Sandbox, SandboxConfig, workload
from lj_runtimekit.testkit.dra import (
    DRA_NODES,
    RESOURCE_API,
    DraCluster,
    DraSpace,
    check_sharing_invariant,
    example_devices,
)
from lj_runtimekit.testkit.waits import wait_for

_NAMESPACES = itertools.count(1)


def make_bed(
    kinds: tuple[str, ...], session: pytest.Session, *, read_only_port: bool = True
) -> Iterator[Sandbox]:
    """A started sandbox with its nodes enabled (logs kept when a test of it failed);
    `read_only_port=False`: the kubelets keep /pods closed (the API server serves)."""
    try:
        find_tools()
    except ToolsMissingError as exc:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"{exc} (run `make k8s-tools`)")
        pytest.skip(str(exc))
    state = Path(tempfile.mkdtemp(prefix="lje2e", dir="/tmp"))
    config = SandboxConfig(
        nodes=len(kinds), kinds=kinds, state_dir=state, kubelet_read_only_port=read_only_port
    )
    bed = Sandbox(config, progress=lambda m: print(f"[bed] {m}", flush=True))
    with bed:
        with bed.api_client() as api:
            names = [n.name for n in bed.nodes]
            workload.label_nodes(api, names, bed.protocol.labels.enable, "true")
            workload.wait_feature_state(api, names, "enabled")
        failed_before = session.testsfailed
        yield bed
        if session.testsfailed > failed_before:
            bed.config.keep_state = True
            print(f"[bed] a test failed: logs kept in {bed.log_dir}", flush=True)


@pytest.fixture(scope="module")
def bed(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A started sandbox with its nodes enabled; kinds from the module's BED_KINDS."""
    kinds = getattr(request.module, "BED_KINDS", ("tdm-8gpu", "mig-8gpu"))
    yield from make_bed(tuple(kinds), request.session)


@pytest.fixture
def api(bed: Sandbox) -> Iterator[k8s_client.ApiClient]:
    with bed.api_client() as client:
        yield client


@pytest.fixture
def ns(bed: Sandbox, api: k8s_client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; its pods are deleted afterwards (devices freed)."""
    short = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())
    name = f"e2e{next(_NAMESPACES)}-{short.replace('test-', '', 1)[:40].strip('-')}"
    workload.ensure_namespace(api, name)
    yield name
    k8s_client.CoreV1Api(api).delete_namespace(name)
    # The Device Plugin releases a gone pod's Runtime allocation after its grace period;
    # wait for it so that the next test starts from free devices.
    wait_for(
        lambda: name not in workload.runtime_namespaces(bed.nodes),
        60,
        f"Runtime allocations of namespace {name} released",
    )


PROTOCOL = load_protocol()
MIG_PROFILES = sorted(
    {i.profile for d in example_devices(DRA_NODES["dra-mig"]) for i in d.mig_instances}
)
"""The profiles the MIG node's instances have: each gets a class naming its resource."""


@pytest.fixture(scope="module")
def dra_cluster(dra_k8s_tools: object) -> Iterator[DraCluster]:
    """A control plane of the DRA mode's release with three KWOK nodes in DRA mode, their
    slices and our classes."""
    config = ControlPlaneConfig(version=DRA_VERSION, feature_gates=dra_gates(DRA_VERSION))
    plane = ControlPlane(config).start()
    api = plane.api_client()
    kube = KubeClient.connect(str(plane.kubeconfig_path))
    try:
        factory = NodeFactory(api, group="dra")
        for node in DRA_NODES:
            factory.create(node, gpus=0, labels={PROTOCOL.labels.device_api: DRA_MODE}, wait=False)
        factory.wait_ready(list(DRA_NODES))
        for obj in device_classes(PROTOCOL, extended_resources=True, mig_profiles=MIG_PROFILES):
            kube.request("POST", f"{RESOURCE_API}/deviceclasses", obj)
        inventories: dict[str, list[pb.Device]] = {}
        apart = counters_apart(server_minor(kube.request("GET", "/version")))
        for node, example in DRA_NODES.items():
            inventories[node] = example_devices(example, node)
            uid = kube.request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
            for obj in build_slices(
                inventories[node],
                node_name=node,
                protocol=PROTOCOL,
                generation=1,
                node_uid=uid,
                apart=apart,
            ):
                kube.request("POST", f"{RESOURCE_API}/resourceslices", obj)
        yield DraCluster(kube, inventories, str(plane.kubeconfig_path))
    finally:
        kube.close()
        api.close()
        plane.stop()


@pytest.fixture
def dra_space(dra_cluster: DraCluster) -> Iterator[DraSpace]:
    """A fresh namespace; afterwards the cluster's claims are checked against the sharing
    invariant and this namespace's pods and claims are removed."""
    name = f"dra-{next(_NAMESPACES)}"
    dra_cluster.kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    wait_for(
        lambda: any(
            sa["metadata"]["name"] == "default"
            for sa in dra_cluster.kube.list_all(f"/api/v1/namespaces/{name}/serviceaccounts")[0]
        ),
        30,
        f"ServiceAccount default in {name}",
    )
    out = DraSpace(dra_cluster, name)
    yield out
    check_sharing_invariant(dra_cluster.shares())
    out.clean()
