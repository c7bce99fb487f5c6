"""Factory of Lingjun GPU nodes managed by KWOK.

A node gets the KWOK annotation, the enable label when asked, device labels,
capacity/allocatable of the three protocol resources (GPU count; core and
memory percentage at 100 per device) plus cpu/memory/pods, taints and
topology labels as asked. Resource and label names default to the protocol
defaults (docs/architecture.md, Names); pass a `ProtocolNames` to follow another
protocol.yaml.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.envtest.kwok import FAKE_NODE_ANNOTATION, FAKE_NODE_VALUE

GROUP_LABEL = "envtest.lj-runtimekit.io/group"
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class TaintDict(TypedDict):
    key: str
    effect: TaintEffect
    value: NotRequired[str]


class ObjectMetaDict(TypedDict):
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]


class NodeSpecDict(TypedDict):
    taints: list[TaintDict]


class NodeStatusDict(TypedDict):
    capacity: dict[str, str]
    allocatable: dict[str, str]


class NodeManifest(TypedDict):
    apiVersion: Literal["v1"]
    kind: Literal["Node"]
    metadata: ObjectMetaDict
    spec: NodeSpecDict
    status: NodeStatusDict


@dataclass(frozen=True)
class ProtocolNames:
    """Resource and label names of the protocol (defaults: docs/architecture.md, Names)."""

    gpu: str = "alibabacloud.com/gpu"
    gpu_core: str = "alibabacloud.com/gpu-core.percentage"
    gpu_memory: str = "alibabacloud.com/gpu-memory.percentage"
    enable_label: str = "lj_runtimekit_enable"
    device_kind_label: str = "lingjun.com/device-kind"
    device_model_label: str = "lingjun.com/device-model"
    device_count_label: str = "lingjun.com/device-count"
    topology_block_label: str = "lingjun.com/topology-block"
    topology_switch_label: str = "lingjun.com/topology-switch"

    @classmethod
    def from_protocol(cls, protocol: Any) -> ProtocolNames:
        """From a `lj_runtimekit.proto.pkg.protocol.Protocol` (e.g. `load_protocol(path)`),
        read structurally so that envtest does not depend on the contract package."""
        resources, labels = protocol.resources, protocol.labels
        return cls(
            gpu=resources.gpu,
            gpu_core=resources.core,
            gpu_memory=resources.memory,
            enable_label=labels.enable,
            device_kind_label=labels.device_kind,
            device_model_label=labels.device_model,
            device_count_label=labels.device_count,
            topology_block_label=labels.topology_block,
            topology_switch_label=labels.topology_switch,
        )


@dataclass(frozen=True)
class Taint:
    key: str
    effect: TaintEffect = "NoSchedule"
    value: str = ""

    def to_dict(self) -> TaintDict:
        taint: TaintDict = {"key": self.key, "effect": self.effect}
        if self.value:
            taint["value"] = self.value
        return taint


@dataclass(frozen=True)
class GpuNodeSpec:
    """One fake Lingjun node. `gpus=0` makes a node without GPU resources."""

    name: str
    gpus: int = 8
    enable: bool = True
    device_kind: str = "gpu"
    device_model: str = "H200"
    cpu: str = "96"
    memory: str = "768Gi"
    pods: str = "110"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Taint] = ()
    topology_block: str | None = None
    topology_switch: str | None = None

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"node name {self.name!r} is not a DNS subdomain")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")


def gpu_node_manifest(
    spec: GpuNodeSpec, names: ProtocolNames | None = None, group: str | None = None
) -> NodeManifest:
    """The Node object (with status) for `spec`."""
    n = names or ProtocolNames()
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if spec.gpus > 0:
        labels[n.device_kind_label] = spec.device_kind
        labels[n.device_model_label] = spec.device_model
        labels[n.device_count_label] = str(spec.gpus)
    if spec.enable:
        labels[n.enable_label] = "true"
    if spec.topology_block is not None:
        labels[n.topology_block_label] = spec.topology_block
    if spec.topology_switch is not None:
        labels[n.topology_switch_label] = spec.topology_switch
    if group is not None:
        labels[GROUP_LABEL] = group
    labels.update(spec.labels)
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods}
    if spec.gpus > 0:
        resources[n.gpu] = str(spec.gpus)
        resources[n.gpu_core] = str(100 * spec.gpus)
        resources[n.gpu_memory] = str(100 * spec.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {FAKE_NODE_ANNOTATION: FAKE_NODE_VALUE},
        },
        "spec": {"taints": [t.to_dict() for t in spec.taints]},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def node_ready(node: Any, untainted: bool = True) -> bool:
    """True when the Node (client model) has Ready=True and, if `untainted`, the node
    lifecycle controller has removed its not-ready taint (needed for scheduling)."""
    conditions = (node.status and node.status.conditions) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    if not ready or not untainted:
        return ready
    taints = (node.spec and node.spec.taints) or []
    return not any(t.key == "node.kubernetes.io/not-ready" for t in taints)


def node_dict_ready(node: Mapping[str, Any], untainted: bool = True) -> bool:
    """node_ready for a Node as decoded JSON."""
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if not ready or not untainted:
        return ready
    taints = node.get("spec", {}).get("taints") or []
    return not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)


class NodeFactory:
    """Creates fake GPU nodes and deletes them again (`cleanup`).

    `group` labels every node with GROUP_LABEL=group so that a test can pin its
    pods to its own nodes with a node selector (nodes are cluster-scoped).
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        group: str | None = None,
        names: ProtocolNames | None = None,
    ) -> None:
        self.core = k8s_client.CoreV1Api(api)
        self.group = group
        self.names = names or ProtocolNames()
        self.created: list[str] = []

    @property
    def selector(self) -> dict[str, str]:
        """Node selector matching this factory's nodes."""
        if self.group is None:
            raise ValueError("a NodeFactory without a group has no selector")
        return {GROUP_LABEL: self.group}

    def create(self, name: str, *, wait: bool = True, timeout_s: float = 60, **spec: Any) -> str:
        """Creates one node (keyword arguments as GpuNodeSpec); waits for Ready by default."""
        node = GpuNodeSpec(name=name, **spec)
        self.core.create_node(gpu_node_manifest(node, self.names, self.group))
        self.created.append(name)
        if wait:
            self.wait_ready([name], timeout_s)
        return name

    def create_many(self, specs: Iterable[GpuNodeSpec]) -> list[str]:
        """Creates nodes without waiting."""
        made: list[str] = []
        for spec in specs:
            manifest = gpu_node_manifest(spec, self.names, self.group)
            self.core.create_node(manifest, _preload_content=False)
            self.created.append(spec.name)
            made.append(spec.name)
        return made

    def wait_ready(
        self, names: Sequence[str], timeout_s: float = 60, untainted: bool = True
    ) -> None:
        """Waits until every named node is Ready (KWOK) and, by default, untainted by the
        node lifecycle controller (kube-controller-manager) so that pods can schedule."""
        pending = set(names)
        deadline = time.monotonic() + timeout_s
        while pending:
            if len(pending) > 20:
                selector = f"{GROUP_LABEL}={self.group}" if self.group else None
                # Raw JSON: deserialising a thousand Node models takes seconds.
                response = self.core.list_node(label_selector=selector, _preload_content=False)
                items = json.loads(response.data)["items"]
                pending -= {n["metadata"]["name"] for n in items if node_dict_ready(n, untainted)}
            else:
                for name in list(pending):
                    if node_ready(self.core.read_node(name), untainted):
                        pending.discard(name)
            if not pending:
                return
            if time.monotonic() > deadline:
                sample = ", ".join(sorted(pending)[:5])
                raise TimeoutError(
                    f"{len(pending)} node(s) not Ready after {timeout_s:.0f}s (e.g. {sample}); "
                    "is KWOK running against this API server?"
                )
            time.sleep(0.2)

    def cleanup(self) -> None:
        """Deletes every node this factory created (missing ones are fine)."""
        for name in self.created:
            try:
                self.core.delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.created.clear()
