"""The hollow node's DRA manager (the kubelet's own, pkg/kubelet/cm/dra) against a DRA
kubelet plugin written here on the real protocols: pluginregistration (type DRAPlugin)
and the DRAPlugin v1 service, over unix sockets.

What the kubelet does, not our model of it: registration through plugins_registry,
NodePrepareResources with the claim kube-scheduler allocated before the pod's sandbox
and containers, the returned CDI IDs in CreateContainer, the claim in the PodResources
API (List and Get), a failed prepare keeping the pod from starting (an event on the
pod), the DRA checkpoint across a kubelet restart, and NodeUnprepareResources once the
pod is gone.

Twice: on the DRA mode's release (DRA_VERSION, its DRA parts on by default, no gates)
and on the pinned K8S_VERSION with the alpha gates (DRA_GATES).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.envtest.controlplane import (
    DRA_GATES,
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    dra_gates,
)
from lj_runtimekit.envtest.hollownode import BINARY, HollowNode
from lj_runtimekit.envtest.versions import (
    TOOLS,
    ToolsMissingError,
    find_tools,
    load_versions,
    minor,
)
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2 as dra_pb2
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2_grpc as dra_grpc
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2 as reg_pb2
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2_grpc as prgrpc
from lj_runtimekit.testkit.waits import wait_for

DRIVER = "gpu.example.com"
DEVICE_CLASS = "gpu.example.com"
CDI_IDS = ("example.com/gpu=dev-0", "example.com/gpu=common")
RESOURCE = ("resource.k8s.io", "v1")

pytestmark = pytest.mark.controlplane

Claim = tuple[str, str, str]  # namespace, name, uid


class ExampleDRAPlugin(dra_grpc.DRAPluginServicer, reg_grpc.RegistrationServicer):
    """Registration (GetInfo: a DRAPlugin for DRIVER on `endpoint`) and DRAPlugin v1.
    NodePrepareResources answers device dev-0 of the node's pool with CDI_IDS, or the
    per-claim error `fail` while it is set; it records each claim and the container
    records (cdi-devices/) present at that moment. Records every call."""

    def __init__(self, node: HollowNode, endpoint: Path) -> None:
        self.node = node
        self.endpoint = endpoint
        self.registrations: list[tuple[bool, str]] = []
        self.prepared: list[Claim] = []
        self.records_at_prepare: list[list[str]] = []
        self.unprepared: list[Claim] = []
        self.fail: str | None = None
        self._lock = threading.Lock()

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=["v1.DRAPlugin"],
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        with self._lock:
            self.registrations.append((request.plugin_registered, request.error))
        return reg_pb2.RegistrationStatusResponse()

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        records = sorted(p.name for p in self.node.cdi_devices_dir.glob("*.json"))
        response = dra_pb2.NodePrepareResourcesResponse()
        with self._lock:
            for claim in request.claims:
                self.prepared.append((claim.namespace, claim.name, claim.uid))
                self.records_at_prepare.append(records)
                if self.fail is not None:
                    response.claims[claim.uid].error = self.fail
                    continue
                response.claims[claim.uid].devices.append(
                    dra_pb2.Device(
                        pool_name=self.node.name, device_name="dev-0", cdi_device_ids=CDI_IDS
                    )
                )
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        with self._lock:
            for claim in request.claims:
                self.unprepared.append((claim.namespace, claim.name, claim.uid))
                response.claims[claim.uid].CopyFrom(dra_pb2.NodeUnprepareResourceResponse())
        return response

    def registered(self) -> int:
        """How many times the kubelet reported a successful registration."""
        with self._lock:
            return sum(1 for ok, _ in self.registrations if ok)


def serve(plugin: ExampleDRAPlugin, node: HollowNode) -> grpc.Server:
    """Serves DRAPlugin on the plugin's endpoint and Registration in plugins_registry,
    where the kubelet's plugin watcher finds it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    dra_grpc.add_DRAPluginServicer_to_server(plugin, server)
    reg_grpc.add_RegistrationServicer_to_server(plugin, server)
    plugin.endpoint.parent.mkdir(parents=True, exist_ok=True)
    server.add_insecure_port(f"unix://{plugin.endpoint}")
    server.add_insecure_port(f"unix://{node.plugins_registry / f'{DRIVER}-reg.sock'}")
    server.start()
    return server


def pod_resources(node: HollowNode, method: str, **request: str) -> Any:
    """Calls PodResourcesLister.<method> (List, Get) on the node's socket."""
    with grpc.insecure_channel(f"unix://{node.pod_resources_socket}") as channel:
        stub = prgrpc.PodResourcesListerStub(channel)
        if method == "List":
            return stub.List(prpb.ListPodResourcesRequest(), timeout=10)
        return stub.Get(prpb.GetPodResourcesRequest(**request), timeout=10)


def dynamic_resources(pod: Any, container: str) -> list[tuple[str, str, list[Any]]]:
    """(claim namespace, claim name, [(driver, pool, device, [CDI IDs])]) of a
    PodResources entry's container."""
    entry = next(c for c in pod.containers if c.name == container)
    return [
        (
            d.claim_namespace,
            d.claim_name,
            [
                (r.driver_name, r.pool_name, r.device_name, [c.name for c in r.cdi_devices])
                for r in d.claim_resources
            ],
        )
        for d in entry.dynamic_resources
    ]


def resource_slice(node: str) -> dict[str, Any]:
    """The node's pool: two devices of DRIVER."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}, {"name": "dev-1"}],
        },
    }


def claim_pod(name: str, node: str) -> dict[str, Any]:
    """A pod (scheduled by kube-scheduler, onto `node`) with a claim from the template
    "one-gpu" used by its container "app"."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [
                {
                    "name": "app",
                    "image": "example.invalid/app:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((DRA_VERSION, dra_gates(DRA_VERSION)), id="dra-version"),
        pytest.param((load_versions().k8s, DRA_GATES), id="k8s-version-alpha-gates"),
    ],
)
def dra_control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane of its own on a release with what the DRA mode needs there."""
    version, gates = request.param
    if minor(version) < 34:
        pytest.skip(f"Kubernetes {version}: the DRA mode needs 1.34 or later")
    try:
        find_tools((*TOOLS, BINARY), version)
    except ToolsMissingError as exc:
        # As the control_plane fixture: never skip under CI=true.
        if _in_ci():
            pytest.fail(f"{exc} (CI=true: control plane tests never skip)", pytrace=False)
        pytest.skip(str(exc))
    cp = ControlPlane(ControlPlaneConfig(kwok=False, feature_gates=gates, version=version))
    cp.start()
    yield cp
    cp.stop(failed=request.session.testsfailed > 0)


def test_dra_plugin_against_the_real_kubelet(dra_control_plane: ControlPlane) -> None:
    cp = dra_control_plane
    version = cp.config.version
    assert version is not None
    api = cp.api_client()
    core = k8s_client.CoreV1Api(api)
    objects = k8s_client.CustomObjectsApi(api)
    ns = f"dra-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(
        lambda: core.list_namespaced_service_account(ns).items,
        30,
        f"ServiceAccount default in namespace {ns}",
    )
    node = HollowNode(cp, f"hollow-{secrets.token_hex(3)}")
    assert node.feature_gates == cp.config.feature_gates  # the control plane's, by default
    node.start()
    # The control plane and the kubelet are the release asked for.
    assert k8s_client.VersionApi(api).get_code().git_version == cp.config.version
    assert core.read_node(node.name).status.node_info.kubelet_version == cp.config.version
    plugin = ExampleDRAPlugin(node, node.plugins_dir / DRIVER / "dra.sock")
    server = serve(plugin, node)

    def events(pod: str) -> list[tuple[str, str]]:
        listed = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}")
        return [(e.reason or "", e.message or "") for e in listed.items]

    def pod_status(name: str) -> Any:
        return core.read_namespaced_pod_status(name, ns).status

    def running(name: str) -> bool:
        return bool(pod_status(name).phase == "Running")

    def gone(name: str) -> bool:
        try:
            core.read_namespaced_pod(name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    def claim_of(name: str) -> Claim:
        claim_name = pod_status(name).resource_claim_statuses[0].resource_claim_name
        claim = objects.get_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim_name)
        return ns, claim_name, claim["metadata"]["uid"]

    try:
        # Registration through plugins_registry: GetInfo, then the kubelet's verdict.
        wait_for(plugin.registered, 30, f"the kubelet to register {DRIVER}")
        assert plugin.registrations == [(True, "")]

        # The kubelet deletes its node's slices at start: publish after that.
        node.wait_resource_slices_wiped()
        objects.create_cluster_custom_object(
            *RESOURCE,
            "deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DEVICE_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        objects.create_cluster_custom_object(*RESOURCE, "resourceslices", resource_slice(node.name))
        objects.create_namespaced_custom_object(
            *RESOURCE,
            ns,
            "resourceclaimtemplates",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}
                            ]
                        }
                    }
                },
            },
        )

        # Scheduled by kube-scheduler with the claim allocated; prepared before the
        # sandbox and containers; the container gets exactly the returned CDI IDs.
        core.create_namespaced_pod(ns, claim_pod("a", node.name))
        wait_for(lambda: running("a"), 60, "pod a Running", describe=lambda: events("a"))
        uid_a = core.read_namespaced_pod("a", ns).metadata.uid
        claim_a = claim_of("a")
        assert plugin.prepared == [claim_a]
        assert not [r for r in plugin.records_at_prepare[0] if r.startswith(uid_a)]
        assert node.container_cdi_devices(uid_a, "app") == list(CDI_IDS)
        assert claim_a[2] in node.dra_checkpoint_path.read_text()

        # PodResources: the claim's device and CDI IDs, in List and in Get.
        expected = [(ns, claim_a[1], [(DRIVER, node.name, "dev-0", list(CDI_IDS))])]
        listed = [p for p in pod_resources(node, "List").pod_resources if p.namespace == ns]
        assert [p.name for p in listed] == ["a"]
        assert dynamic_resources(listed[0], "app") == expected
        got = pod_resources(node, "Get", pod_name="a", pod_namespace=ns).pod_resources
        assert dynamic_resources(got, "app") == expected

        # A prepare that fails: no sandbox, no container, the error on the pod's events.
        plugin.fail = "example: dev-1 is busy"
        core.create_namespaced_pod(ns, claim_pod("b", node.name))

        def failed_prepare() -> list[str]:
            return [m for r, m in events("b") if r == "FailedPrepareDynamicResources"]

        messages = wait_for(failed_prepare, 60, "FailedPrepareDynamicResources on pod b")
        assert "example: dev-1 is busy" in messages[0], messages
        uid_b = core.read_namespaced_pod("b", ns).metadata.uid
        claim_b = claim_of("b")
        assert claim_b in plugin.prepared
        assert pod_status("b").phase == "Pending"
        assert node.container_cdi_devices(uid_b, "app") is None
        # The kubelet checkpoints a claim before it calls NodePrepareResources, so a pod
        # whose prepare failed is unprepared too once deleted: the plugin must accept an
        # unprepare of a claim it never prepared.
        core.delete_namespaced_pod("b", ns, grace_period_seconds=0)
        wait_for(lambda: gone("b"), 60, "pod b deleted")
        wait_for(lambda: claim_b in plugin.unprepared, 60, "NodeUnprepareResources for b")
        assert claim_a not in plugin.unprepared
        plugin.fail = None

        # A kubelet restart with pod a running. The fake runtime starts empty, so the
        # kubelet makes the sandbox and container again, as after a node reboot. The
        # kubelet reads its claims back from the checkpoint as not prepared: it calls
        # NodePrepareResources again (the plugin must answer it idempotently); 1.34's
        # appends the answer to the checkpointed devices, so the container gets the CDI
        # IDs twice, 1.37's does not. The registration socket stays: the plugin is
        # registered again without doing anything.
        prepares = len(plugin.prepared)
        (node.cdi_devices_dir / f"{uid_a}_app.json").unlink()
        node.restart()
        wait_for(lambda: plugin.registered() == 2, 30, f"the kubelet to register {DRIVER} again")
        wait_for(
            lambda: node.container_cdi_devices(uid_a, "app"),
            60,
            "container app of pod a created again",
        )
        assert plugin.prepared[prepares:] == [claim_a]
        appended = minor(version) < 37
        assert node.container_cdi_devices(uid_a, "app") == [*CDI_IDS] * (2 if appended else 1)
        assert running("a")

        # The pod gone: NodeUnprepareResources for its claim, dropped from the checkpoint.
        core.delete_namespaced_pod("a", ns, grace_period_seconds=0)
        wait_for(lambda: claim_a in plugin.unprepared, 60, "NodeUnprepareResources for a")
        wait_for(
            lambda: claim_a[2] not in node.dra_checkpoint_path.read_text(),
            30,
            "claim a dropped from the DRA checkpoint",
        )
        assert plugin.unprepared.count(claim_a) == 1
    finally:
        server.stop(grace=None)
        node.stop(delete_node=True)
        for plural, name in (
            ("deviceclasses", DEVICE_CLASS),
            ("resourceslices", f"{node.name}-{DRIVER}"),
        ):
            try:
                objects.delete_cluster_custom_object(*RESOURCE, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        core.delete_namespace(ns, propagation_policy="Background")
        api.close()
