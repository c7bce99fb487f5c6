"""The node's pods as the Exporter needs them, parsed from a Kubernetes PodList (JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

PodSourceName = Literal["kubelet", "apiserver"]

# Pods in these phases hold no devices any more.
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class PodListError(ValueError):
    """A response that is not a Kubernetes PodList; the message says what is wrong."""


@dataclass(frozen=True)
class Pod:
    """One pod of the node: identity, containers, annotations and labels."""

    uid: str
    namespace: str
    name: str
    phase: str
    node_name: str
    containers: tuple[str, ...]
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def ref(self) -> str:
        """`namespace/name`, for log lines."""
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """True while the pod may hold devices (not Succeeded or Failed)."""
        return self.phase not in _FINISHED_PHASES


@dataclass(frozen=True)
class PodView:
    """The node's pods at one moment, and where they were read from."""

    source: PodSourceName
    pods: tuple[Pod, ...]

    def by_uid(self) -> dict[str, Pod]:
        """Pods keyed by UID."""
        return {pod.uid: pod for pod in self.pods}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _strings(value: object) -> Mapping[str, str]:
    """A metadata map (labels, annotations) with its string values only."""
    if not isinstance(value, dict):
        return MappingProxyType({})
    return MappingProxyType({str(k): v for k, v in value.items() if isinstance(v, str)})


def parse_pod(item: object, where: str) -> Pod:
    """Parse one decoded pod; raise PodListError naming `where` when it is not one."""
    if not isinstance(item, dict):
        raise PodListError(f"{where} must be an object")
    meta = item.get("metadata") or {}
    spec = item.get("spec") or {}
    status = item.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
        raise PodListError(f"{where}: metadata, spec and status must be objects")
    uid = _str(meta.get("uid"))
    if not uid:
        raise PodListError(f"{where}.metadata.uid is missing")
    containers = spec.get("containers") or []
    names = tuple(_str(c.get("name")) for c in containers if isinstance(c, dict) and c.get("name"))
    return Pod(
        uid=uid,
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        phase=_str(status.get("phase")),
        node_name=_str(spec.get("nodeName")),
        containers=names,
        annotations=_strings(meta.get("annotations")),
        labels=_strings(meta.get("labels")),
    )


def parse_pod_list(data: object, where: str) -> tuple[Pod, ...]:
    """Parse a decoded PodList; raise PodListError naming `where` when it is not one."""
    if not isinstance(data, dict):
        raise PodListError(f"{where}: expected a JSON object (a PodList)")
    items = data.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise PodListError(f"{where}: 'items' must be a list of pods")
    return tuple(parse_pod(item, f"{where}: items[{i}]") for i, item in enumerate(items))
