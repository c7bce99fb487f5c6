"""The hollow node (lj-hollow-node: the kubelet's own code with its real device manager)
against a device plugin written here on the real v1beta1 protocol.

What the kubelet does, not our model of it: registration on the node's plugin
directory, ListAndWatch into the Node's allocatable, one Allocate RPC per container at
admission (init containers first; the app container reuses the init container's
device), the Allocate envs in the container's environment, the PodResources API, and
admission failures (not enough devices; a failed Allocate).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.hollownode import BINARY, HollowNode
from lj_runtimekit.envtest.versions import ToolsMissingError, find_tools
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit.testkit.waits import wait_for

RESOURCE = "example.com/dev"
DEVICES = ("dev-0", "dev-1")

pytestmark = pytest.mark.controlplane


class ExamplePlugin(api_pb2_grpc.DevicePluginServicer):
    """Healthy devices; asks for GetPreferredAllocation (prefers the last available
    device) and PreStartContainer. Allocate answers with the devices and a call number
    in the environment and fails while `fail_allocate` is set. Records every call."""

    options = api_pb2.DevicePluginOptions(
        pre_start_required=True, get_preferred_allocation_available=True
    )

    def __init__(self, devices: tuple[str, ...]) -> None:
        self.devices = devices
        self.allocations: list[list[str]] = []
        self.preferred: list[tuple[list[str], int]] = []
        self.pre_starts: list[list[str]] = []
        self.fail_allocate = False
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return self.options

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        yield api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=d, health="Healthy") for d in self.devices]
        )
        while not self._stop.wait(0.2) and context.is_active():
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        responses = []
        with self._lock:
            for c in request.container_requests:
                available = sorted(c.available_deviceIDs)
                self.preferred.append((available, c.allocation_size))
                chosen = [*c.must_include_deviceIDs]
                chosen += [d for d in reversed(available) if d not in chosen]
                responses.append(
                    api_pb2.ContainerPreferredAllocationResponse(
                        deviceIDs=chosen[: c.allocation_size]
                    )
                )
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        with self._lock:
            for container in request.container_requests:
                if self.fail_allocate:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "example plugin: allocation refused")
                self.allocations.append(list(container.devices_ids))
                envs = {
                    "EXAMPLE_DEVICES": ",".join(container.devices_ids),
                    "EXAMPLE_CALL": str(len(self.allocations)),
                }
                responses.append(api_pb2.ContainerAllocateResponse(envs=envs))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        with self._lock:
            self.pre_starts.append(list(request.devices_ids))
        return api_pb2.PreStartContainerResponse()

    def stop(self) -> None:
        self._stop.set()


def serve_and_register(plugin: ExamplePlugin, node: HollowNode) -> grpc.Server:
    """Serves the plugin on the node's plugin directory and registers it with the kubelet."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{node.plugin_dir / 'example.sock'}")
    server.start()
    with grpc.insecure_channel(f"unix://{node.registration_socket}") as channel:
        api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(
                version="v1beta1",
                endpoint="example.sock",
                resource_name=RESOURCE,
                options=plugin.options,
            ),
            timeout=10,
        )
    return server


def _pod_resources_messages() -> dict[str, Any]:
    """The kubelet's PodResources v1 messages (k8s.io/kubelet/pkg/apis/podresources/v1),
    only the fields read here, built at run time: field numbers as upstream."""
    f = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="lj_test_podresources.proto", package="v1")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name

    rep, opt = f.LABEL_REPEATED, f.LABEL_OPTIONAL
    message("Empty")
    message(
        "ContainerDevices",
        ("resource_name", 1, f.TYPE_STRING, opt, ""),
        ("device_ids", 2, f.TYPE_STRING, rep, ""),
    )
    message(
        "ContainerResources",
        ("name", 1, f.TYPE_STRING, opt, ""),
        ("devices", 2, f.TYPE_MESSAGE, rep, ".v1.ContainerDevices"),
    )
    message(
        "PodResources",
        ("name", 1, f.TYPE_STRING, opt, ""),
        ("namespace", 2, f.TYPE_STRING, opt, ""),
        ("containers", 3, f.TYPE_MESSAGE, rep, ".v1.ContainerResources"),
    )
    message(
        "ListPodResourcesResponse", ("pod_resources", 1, f.TYPE_MESSAGE, rep, ".v1.PodResources")
    )
    message(
        "AllocatableResourcesResponse", ("devices", 1, f.TYPE_MESSAGE, rep, ".v1.ContainerDevices")
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in ("Empty", "ListPodResourcesResponse", "AllocatableResourcesResponse")
    }


def pod_resources(socket_path: Path, method: str) -> Any:
    """Calls /v1.PodResourcesLister/<method> (List, GetAllocatableResources)."""
    messages = _pod_resources_messages()
    response = {
        "List": "ListPodResourcesResponse",
        "GetAllocatableResources": "AllocatableResourcesResponse",
    }[method]
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call: grpc.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
            f"/v1.PodResourcesLister/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=messages[response].FromString,
        )
        return call(messages["Empty"](), timeout=10)


def device_pod(name: str, node: str, init: bool, devices: int = 1) -> dict[str, Any]:
    """A pod bound to `node` whose containers each ask `devices` devices.

    The init container is run for real (--exec-command-prefix=/bin/sh): it succeeds only
    when it got the first Allocate's environment; the app container checks that it got
    the second, then sleeps until the pod is deleted.
    """
    limits = {RESOURCE: str(devices)}
    app = {
        "name": "app",
        "image": "example.invalid/app:1",
        "command": ["/bin/sh", "-c", 'test "$EXAMPLE_CALL" = 2 && exec sleep 600'],
        "resources": {"limits": limits},
    }
    spec: dict[str, Any] = {"nodeName": node, "restartPolicy": "Never", "containers": [app]}
    if init:
        spec["initContainers"] = [
            {
                "name": "init",
                "image": "example.invalid/init:1",
                "command": ["/bin/sh", "-c", 'test "$EXAMPLE_CALL" = 1 -a -n "$EXAMPLE_DEVICES"'],
                "resources": {"limits": limits},
            }
        ]
    return {"metadata": {"name": name}, "spec": spec}


def pod_phase(core: k8s_client.CoreV1Api, namespace: str, name: str) -> tuple[str, str]:
    status = core.read_namespaced_pod_status(name, namespace).status
    return status.phase or "", status.reason or ""


@pytest.fixture
def hollow_node(control_plane: ControlPlane) -> Iterator[HollowNode]:
    try:
        find_tools((BINARY,))
    except ToolsMissingError as exc:
        # As the control_plane fixture: never skip under CI=true.
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"{exc} (CI=true: control plane tests never skip)", pytrace=False)
        pytest.skip(str(exc))
    node = HollowNode(
        control_plane,
        f"hollow-{secrets.token_hex(3)}",
        address="127.0.0.2",
        exec_command_prefix="/bin/sh",
    )
    node.start()
    yield node
    node.stop(delete_node=True)


def test_device_plugin_against_the_real_kubelet(
    hollow_node: HollowNode, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    node = hollow_node.name
    plugin = ExamplePlugin(DEVICES)
    server = serve_and_register(plugin, hollow_node)
    try:
        # ListAndWatch -> the kubelet's device manager -> Node status.
        wait_for(
            lambda: (core.read_node(node).status.allocatable or {}).get(RESOURCE) == "2",
            30,
            f"{RESOURCE}=2 in Node {node} allocatable",
            describe=lambda: str(core.read_node(node).status.allocatable),
        )
        capacity = core.read_node(node).status.capacity
        assert capacity[RESOURCE] == "2"
        assert capacity["cpu"] == "64"  # a GPU node's size, not cadvisor's 1-CPU fake

        # Admission: GetPreferredAllocation and Allocate for the init container, then
        # Allocate for the app container, which reuses the init container's device;
        # PreStartContainer before each container starts.
        core.create_namespaced_pod(namespace, device_pod("reuse", node, init=True))
        wait_for(
            lambda: pod_phase(core, namespace, "reuse")[0] == "Running",
            60,
            "pod reuse Running",
            describe=lambda: str(core.read_namespaced_pod_status("reuse", namespace).status),
        )
        assert len(plugin.allocations) == 2, plugin.allocations
        first, second = plugin.allocations
        assert first == ["dev-1"], "the kubelet did not take the preferred device"
        assert second == first, "the app container did not get the init container's device"
        assert plugin.preferred == [(list(DEVICES), 1)]
        assert plugin.pre_starts == [first, first]
        statuses = core.read_namespaced_pod_status("reuse", namespace).status
        assert statuses.init_container_statuses[0].state.terminated.exit_code == 0

        kubelet_pods = hollow_node.kubelet_pods()
        assert "reuse" in {p["metadata"]["name"] for p in kubelet_pods}

        # PodResources: the app container holds the device; both are allocatable.
        listed = pod_resources(hollow_node.pod_resources_socket, "List")
        ours = [p for p in listed.pod_resources if p.namespace == namespace]
        assert [p.name for p in ours] == ["reuse"]
        app = next(c for c in ours[0].containers if c.name == "app")
        assert [(d.resource_name, list(d.device_ids)) for d in app.devices] == [(RESOURCE, first)]
        allocatable = pod_resources(hollow_node.pod_resources_socket, "GetAllocatableResources")
        assert sorted(i for d in allocatable.devices for i in d.device_ids) == list(DEVICES)

        # Three devices on a two-device node: rejected at admission.
        core.create_namespaced_pod(namespace, device_pod("too-many", node, init=False, devices=3))
        wait_for(
            lambda: pod_phase(core, namespace, "too-many")[0] == "Failed",
            30,
            "pod too-many Failed",
        )
        assert pod_phase(core, namespace, "too-many")[1] in {
            f"OutOf{RESOURCE}",
            "UnexpectedAdmissionError",
        }

        # A failed Allocate RPC: UnexpectedAdmissionError, as on a real kubelet.
        plugin.fail_allocate = True
        calls = len(plugin.allocations)
        core.create_namespaced_pod(namespace, device_pod("refused", node, init=False))
        wait_for(
            lambda: pod_phase(core, namespace, "refused")[0] == "Failed",
            30,
            "pod refused Failed",
        )
        status = core.read_namespaced_pod_status("refused", namespace).status
        assert status.reason == "UnexpectedAdmissionError"
        assert "allocation refused" in (status.message or "")
        assert len(plugin.allocations) == calls
    finally:
        plugin.stop()
        server.stop(grace=None)


def test_two_nodes_and_a_restart(
    hollow_node: HollowNode,
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
) -> None:
    """Two nodes side by side, each with its own plugin directory and address; a restart
    keeps the checkpoint, empties the plugin directory (the plugin registers again) and
    the node goes on admitting pods."""
    core = k8s_client.CoreV1Api(api_client)
    other = HollowNode(control_plane, f"{hollow_node.name}-b", address="127.0.0.3")
    other.start()
    plugins = {n.name: ExamplePlugin(DEVICES) for n in (hollow_node, other)}
    servers = {n.name: serve_and_register(plugins[n.name], n) for n in (hollow_node, other)}

    def allocatable(name: str) -> str | None:
        value: str | None = (core.read_node(name).status.allocatable or {}).get(RESOURCE)
        return value

    def has_two(name: str) -> bool:
        return allocatable(name) == "2"

    try:
        assert hollow_node.plugin_dir != other.plugin_dir
        for name in (hollow_node.name, other.name):
            wait_for(partial(has_two, name), 30, f"{RESOURCE} on {name}")
        assert other.kubelet_pods() == []

        node = hollow_node.name
        core.create_namespaced_pod(namespace, device_pod("before", node, init=True))
        wait_for(lambda: pod_phase(core, namespace, "before")[0] == "Running", 60, "before")
        uid = core.read_namespaced_pod("before", namespace).metadata.uid
        assert uid in hollow_node.checkpoint_path.read_text()
        assert plugins[other.name].allocations == []

        servers.pop(node).stop(grace=None)
        hollow_node.restart()
        assert hollow_node.checkpoint_path.exists()
        assert not (hollow_node.plugin_dir / "example.sock").exists()
        plugins[node].stop()
        plugins[node] = ExamplePlugin(DEVICES)
        servers[node] = serve_and_register(plugins[node], hollow_node)
        wait_for(lambda: allocatable(node) == "2", 30, f"{RESOURCE} on {node} after restart")

        core.create_namespaced_pod(namespace, device_pod("after", node, init=True))
        wait_for(lambda: pod_phase(core, namespace, "after")[0] == "Running", 60, "after")
        after = plugins[node].allocations
        assert len(after) == 2
        assert after[0] == after[1]
    finally:
        for plugin in plugins.values():
            plugin.stop()
        for server in servers.values():
            server.stop(grace=None)
        other.stop(delete_node=True)
