"""Helpers for DRA tests: example inventories as the Runtime reports them, ResourceClaim
templates and pods using them, and reading an allocation back into Runtime shares."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.naming import DeviceRef, resolve, share_of
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DeviceShare, load_protocol
from lj_runtimekit.runtimesim.inventory import build_inventory
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.services import device_message
from lj_runtimekit.runtimesim.state import NodeState
from lj_runtimekit.testkit.waits import NotYet, wait_for

RESOURCE_API = "/apis/resource.k8s.io/v1"


def example_devices(example: str, node_name: str | None = None) -> list[pb.Device]:
    """The devices an example node of the Runtime simulator reports (ListDevices), with IDs
    derived from `node_name` (default: the example's name)."""
    node = load_node_file(EXAMPLE_NODES / f"{example}.yaml")
    if node_name is not None:
        node = dataclasses.replace(node, name=node_name)
    state = NodeState(node, build_inventory(node), node.runtime_version)
    return [device_message(view) for view in state.views()]


def synthetic_gpus(
    count: int, mode: pb.DeviceMode.ValueType, mig_per_gpu: int = 0
) -> list[pb.Device]:
    """`count` healthy 80 GiB GPUs in `mode`, each with `mig_per_gpu` 1g.10gb instances (for
    pools larger than any example node)."""
    gib = 1 << 30
    gpus = []
    for index in range(count):
        gpu = pb.Device(
            id=f"GPU-{index}",
            index=index,
            kind=pb.DEVICE_KIND_GPU,
            model="A100-SXM4-80GB",
            memory_bytes=80 * gib,
            mode=mode,
            health=pb.HEALTH_HEALTHY,
        )
        for n in range(mig_per_gpu):
            gpu.mig_instances.add(
                id=f"MIG-{index}-{n}",
                profile="1g.10gb",
                instance_id=n + 7,
                memory_bytes=10 * gib,
                compute_slices=1,
                health=pb.HEALTH_HEALTHY,
                parent_id=gpu.id,
            )
        gpus.append(gpu)
    return gpus


def claim_template(
    name: str, requests: Sequence[Mapping[str, Any]], namespace: str = "default"
) -> dict[str, Any]:
    """A ResourceClaimTemplate with these `spec.devices.requests` entries."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def exactly(
    name: str,
    device_class: str,
    *,
    count: int = 1,
    selector: str | None = None,
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A claim request for `count` devices of a class, with an optional CEL selector and
    capacity requests."""
    spec: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selector is not None:
        spec["selectors"] = [{"cel": {"expression": selector}}]
    if capacity is not None:
        spec["capacity"] = {"requests": dict(capacity)}
    return {"name": name, "exactly": spec}


def claim_pod(
    name: str,
    claims: Mapping[str, str],
    *,
    containers: Sequence[Mapping[str, Sequence[str]]] = ({"main": ()},),
    init_containers: Sequence[Mapping[str, Sequence[str]]] = (),
    limits: Mapping[str, str] | None = None,
    namespace: str = "default",
    node: str | None = None,
    scheduler_name: str | None = None,
    named: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A pod whose `claims` (pod claim name -> ResourceClaimTemplate name) and `named` (pod
    claim name -> ResourceClaim name) are used by the containers listed as {container name:
    pod claim names}; `limits` go on every container; `node` pins it to a node (by its
    hostname label); `scheduler_name` chooses its scheduler, `priority_class` its
    PriorityClass."""

    def container(name: str, used: Sequence[str]) -> dict[str, Any]:
        resources: dict[str, Any] = {}
        if used:
            resources["claims"] = [{"name": c} for c in used]
        if limits:
            resources["limits"] = dict(limits)
        return {"name": name, "image": "busybox", "resources": resources}

    spec: dict[str, Any] = {
        "containers": [container(n, u) for c in containers for n, u in c.items()],
        "resourceClaims": [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()]
        + [{"name": c, "resourceClaimName": n} for c, n in (named or {}).items()],
    }
    if scheduler_name is not None:
        spec["schedulerName"] = scheduler_name
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if init_containers:
        spec["initContainers"] = [container(n, u) for c in init_containers for n, u in c.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def allocated_shares(
    claim: Mapping[str, Any], driver: str, devices: Mapping[str, Sequence[pb.Device]]
) -> list[tuple[str, DeviceRef, DeviceShare]]:
    """Each device result of an allocated claim as (pool, device, Runtime share), resolved
    against `devices` (pool name -> that node's inventory); AssertionError when a result is
    not ours or does not resolve."""
    results = claim["status"]["allocation"]["devices"]["results"]
    out: list[tuple[str, DeviceRef, DeviceShare]] = []
    for result in results:
        assert result["driver"] == driver, result
        pool = result["pool"]
        assert pool in devices, f"pool {pool} is not a node of the test: {result}"
        ref = resolve(devices[pool], result["device"])
        assert ref is not None, f"device {result['device']} does not resolve on {pool}"
        out.append((pool, ref, share_of(ref, result.get("consumedCapacity"))))
    return out


DRA_NODES = {"dra-tdm": "tdm-8gpu", "dra-mig": "mig-8gpu", "dra-ppu": "ppu-16"}
"""The DRA bed's nodes: name -> the simulator's example inventory they publish."""
_DRIVER = load_protocol().dra.driver
Share = tuple[str, DeviceRef, DeviceShare]


class DraCluster:
    """A DRA control plane's client and its nodes' inventories (pool name -> devices)."""

    def __init__(
        self, kube: KubeClient, inventories: Mapping[str, Sequence[pb.Device]], kubeconfig: str
    ) -> None:
        self.kube = kube
        self.inventories = inventories
        self.kubeconfig = kubeconfig

    def shares(self, namespace: str | None = None) -> list[Share]:
        """Every allocated device of the claims of a namespace (default: all of them)."""
        where = f"/namespaces/{namespace}" if namespace else ""
        items, _ = self.kube.list_all(f"{RESOURCE_API}{where}/resourceclaims")
        return [
            share
            for claim in items
            if claim.get("status", {}).get("allocation")
            for share in allocated_shares(claim, _DRIVER, self.inventories)
        ]


class DraSpace:
    """One test's namespace on the cluster: templates, pods and their claims."""

    def __init__(self, cluster: DraCluster, namespace: str) -> None:
        self.cluster = cluster
        self.kube = cluster.kube
        self.namespace = namespace

    def template(self, name: str, requests: Sequence[dict[str, Any]], **devices: Any) -> None:
        obj = claim_template(name, requests, self.namespace)
        obj["spec"]["spec"]["devices"].update(devices)
        self.kube.request(
            "POST", f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaimtemplates", obj
        )

    def pod(self, name: str, claims: Mapping[str, str], **spec: Any) -> None:
        obj = claim_pod(name, claims, namespace=self.namespace, **spec)
        self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", obj)

    def run(self, name: str, requests: Mapping[str, Sequence[dict[str, Any]]], **spec: Any) -> Any:
        """A template per pod claim, then the pod; the pod once Running."""
        for claim, reqs in requests.items():
            self.template(f"{name}-{claim}", reqs)
        self.pod(name, {c: f"{name}-{c}" for c in requests}, **spec)
        return self.running(name)

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def running(self, name: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | NotYet:
            pod = self.get(name)
            phase = pod.get("status", {}).get("phase")
            return pod if phase == "Running" else NotYet(f"{phase}: {pod.get('status')}")

        return wait_for(check, 60, f"pod {name} Running")

    def settled(self, name: str) -> dict[str, Any]:
        """The pod once Running or reported Unschedulable."""

        def check() -> dict[str, Any] | NotYet:
            pod = self.get(name)
            status = pod.get("status", {})
            if status.get("phase") == "Running" or any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in status.get("conditions") or ()
            ):
                return pod
            return NotYet(str(status))

        return wait_for(check, 60, f"pod {name} Running or Unschedulable")

    def claims_of(self, pod: Mapping[str, Any]) -> dict[str, list[Share]]:
        """Pod claim name (`<extended>` for the extended-resource claim) -> its shares, each
        checked to be on the pod's node."""
        names = {
            s["name"]: s["resourceClaimName"]
            for s in pod["status"].get("resourceClaimStatuses") or ()
        }
        extended = pod["status"].get("extendedResourceClaimStatus")
        if extended:
            names["<extended>"] = extended["resourceClaimName"]
        out: dict[str, list[Share]] = {}
        for name, claim in names.items():
            obj = self.kube.request(
                "GET", f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims/{claim}"
            )
            out[name] = allocated_shares(obj, _DRIVER, self.cluster.inventories)
            assert {pool for pool, _, _ in out[name]} == {pod["spec"]["nodeName"]}, out[name]
        return out

    def clean(self) -> None:
        """Delete every pod and wait until their claims are gone (devices free again)."""
        base = f"/api/v1/namespaces/{self.namespace}/pods"
        self.kube.request("DELETE", base, query={"gracePeriodSeconds": "0"})
        wait_for(
            lambda: not self.cluster.shares(self.namespace),
            60,
            f"claims of namespace {self.namespace} deallocated",
        )


def check_sharing_invariant(shares: Sequence[Share]) -> None:
    """Per device: core and memory percentages add up to at most 100; a whole device or a
    MIG instance has one holder; no TDM share is on a device that is not in TDM mode."""
    cores: dict[tuple[str, str], int] = defaultdict(int)
    memory: dict[tuple[str, str], int] = defaultdict(int)
    holders: dict[tuple[str, str], int] = defaultdict(int)
    exclusive: set[tuple[str, str]] = set()
    for pool, ref, share in shares:
        key = (pool, ref.runtime_id)
        holders[key] += 1
        cores[key] += 100 if share.whole else share.core_percent
        memory[key] += 100 if share.whole else share.memory_percent
        if ref.instance is not None or share.whole:
            exclusive.add(key)
        else:
            assert ref.device.mode == pb.DEVICE_MODE_TDM, f"TDM share on {key}"
    for key, count in holders.items():
        assert cores[key] <= 100, (key, cores[key])
        assert memory[key] <= 100, (key, memory[key])
        assert key not in exclusive or count == 1, (key, count)
