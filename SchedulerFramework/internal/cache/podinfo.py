"""The object model the cache stores: Kubernetes objects as decoded JSON, quantities,
and the parsed pod.

Kubernetes objects travel as the plain JSON dicts the API server sends (no
client model deserialisation on the hot path); a pod is parsed once into a
`PodInfo` when it enters the queue or the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit.proto.pkg.protocol.assignment import peak_use
from lj_runtimekit.proto.pkg.quantity import QuantityError, quantity_value

KubeObject = dict[str, Any]
"""A Kubernetes object as decoded from the API server's JSON."""

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
EPHEMERAL_STORAGE = "ephemeral-storage"


# -- quantities ----------------------------------------------------------------------------


def resource_amount(name: str, value: object) -> int:
    """cpu in millicores, everything else in base units."""
    return quantity_value(value, milli=(name == CPU))


# -- pods ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        if self.effect and self.effect != effect:
            return False
        if self.key and self.key != key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == value  # Equal (the default); empty key needs Exists


@dataclass(frozen=True)
class Requirement:
    """One NodeSelectorRequirement (matchExpressions or matchFields entry)."""

    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class SelectorTerm:
    """One NodeSelectorTerm; the terms of a selector are ORed, requirements ANDed."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]


@dataclass(frozen=True)
class ContainerRequest:
    """What one container asks for (requests, falling back to limits as the API does)."""

    name: str
    requests: Mapping[str, int]
    init: bool = False
    sidecar: bool = False


@dataclass
class PodInfo:
    """A pod parsed once for scheduling."""

    uid: str
    namespace: str
    name: str
    obj: KubeObject
    scheduler_name: str
    node_name: str
    priority: int
    phase: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    runtime_class: str
    containers: tuple[ContainerRequest, ...]
    requests: Mapping[str, int]
    """Effective pod request: `peak_use` of the containers (sidecars count beside the init
    containers declared after them) + overhead, plus pods=1."""
    tolerations: tuple[Toleration, ...]
    node_selector: Mapping[str, str]
    required_affinity: tuple[SelectorTerm, ...] | None
    deleting: bool
    resource_version: str
    parse_errors: tuple[str, ...] = ()
    preferred_affinity: tuple[tuple[int, SelectorTerm], ...] = ()
    """(weight, term) of preferredDuringSchedulingIgnoredDuringExecution node affinity."""
    extra: dict[str, object] = field(default_factory=dict)
    """Per-pod data plugins precompute once (keyed by plugin name)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def claims_made(self) -> object:
        """`status.resourceClaimStatuses`: the ResourceClaims the controller manager made for
        the pod from its templates (None before any)."""
        return (self.obj.get("status") or {}).get("resourceClaimStatuses")

    @property
    def gated(self) -> bool:
        """Whether `spec.schedulingGates` still holds the pod back (a queue in front, e.g.
        Kueue, lifts them on admission)."""
        return bool((self.obj.get("spec") or {}).get("schedulingGates"))


def _container_requests(c: Mapping[str, Any], errors: list[str], where: str) -> dict[str, int]:
    res = c.get("resources") or {}
    limits = res.get("limits") or {}
    requests = dict(limits)
    requests.update(res.get("requests") or {})
    out: dict[str, int] = {}
    for name, value in requests.items():
        try:
            out[name] = resource_amount(name, value)
        except QuantityError as exc:
            errors.append(f"{where}: resource {name}: {exc}")
    return out


def _requirements(items: object) -> tuple[Requirement, ...]:
    out: list[Requirement] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            out.append(
                Requirement(
                    str(item.get("key", "")),
                    str(item.get("operator", "")),
                    tuple(str(v) for v in item.get("values") or ()),
                )
            )
    return tuple(out)


def _affinity_terms(spec: Mapping[str, Any]) -> tuple[SelectorTerm, ...] | None:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return None
    return tuple(
        SelectorTerm(_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
        for t in required.get("nodeSelectorTerms") or ()
        if isinstance(t, dict)
    )


def _preferred_terms(spec: Mapping[str, Any]) -> tuple[tuple[int, SelectorTerm], ...]:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    out: list[tuple[int, SelectorTerm]] = []
    for item in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ():
        if not isinstance(item, dict):
            continue
        weight, term = item.get("weight"), item.get("preference")
        if isinstance(weight, int) and weight > 0 and isinstance(term, dict):
            expressions = _requirements(term.get("matchExpressions"))
            fields = _requirements(term.get("matchFields"))
            out.append((weight, SelectorTerm(expressions, fields)))
    return tuple(out)


def parse_pod(obj: KubeObject) -> PodInfo:
    """Parse a pod object; a malformed quantity is recorded in `parse_errors`, not raised."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    errors: list[str] = []
    containers: list[ContainerRequest] = []
    for c in spec.get("containers") or ():
        req = _container_requests(c, errors, f"container {c.get('name')}")
        containers.append(ContainerRequest(str(c.get("name", "")), req))
    for c in spec.get("initContainers") or ():
        req = _container_requests(c, errors, f"init container {c.get('name')}")
        sidecar = c.get("restartPolicy") == "Always"
        containers.append(ContainerRequest(str(c.get("name", "")), req, init=True, sidecar=sidecar))
    total = peak_use(
        ((c.sidecar, c.requests) for c in containers if c.init),
        (c.requests for c in containers if not c.init),
    )
    for name, value in (spec.get("overhead") or {}).items():
        try:
            total[name] = total.get(name, 0) + resource_amount(name, value)
        except QuantityError as exc:
            errors.append(f"overhead {name}: {exc}")
    total[PODS] = 1
    tolerations = tuple(
        Toleration(
            str(t.get("key") or ""),
            str(t.get("operator") or "Equal"),
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or ()
        if isinstance(t, dict)
    )
    return PodInfo(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        obj=obj,
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        node_name=str(spec.get("nodeName") or ""),
        priority=int(spec.get("priority") or 0),
        phase=str(status.get("phase") or ""),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        runtime_class=str(spec.get("runtimeClassName") or ""),
        containers=tuple(containers),
        requests=total,
        tolerations=tolerations,
        node_selector=spec.get("nodeSelector") or {},
        required_affinity=_affinity_terms(spec),
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=str(meta.get("resourceVersion", "")),
        parse_errors=tuple(errors),
        preferred_affinity=_preferred_terms(spec),
    )
