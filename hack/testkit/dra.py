"""Helpers for DRA tests: example inventories as the Runtime reports them, ResourceClaim
templates and pods using them, and reading an allocation back into Runtime shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.naming import DeviceRef, resolve, share_of
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.runtimesim.inventory import build_inventory
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.services import device_message
from lj_runtimekit.runtimesim.state import NodeState

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
) -> dict[str, Any]:
    """A pod whose `claims` (pod claim name -> ResourceClaimTemplate name) are used by the
    containers listed as {container name: pod claim names}; `limits` go on every container;
    `node` pins it to a node (by its hostname label)."""

    def container(name: str, used: Sequence[str]) -> dict[str, Any]:
        resources: dict[str, Any] = {}
        if used:
            resources["claims"] = [{"name": c} for c in used]
        if limits:
            resources["limits"] = dict(limits)
        return {"name": name, "image": "busybox", "resources": resources}

    spec: dict[str, Any] = {
        "containers": [container(n, u) for c in containers for n, u in c.items()],
        "resourceClaims": [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if init_containers:
        spec["initContainers"] = [container(n, u) for c in init_containers for n, u in c.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
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
