"""The device assignment a scheduler records on a pod, and its encoding.

The Scheduler Framework writes it (annotation `annotations.assigned_devices`),
the Device Plugin reads it in Allocate and records what it really allocated
(`annotations.allocated_devices`, same encoding), the Exporter reads both.

Encoding: a JSON object, container name -> list of device shares; a share is
`{"id": "<device or MIG instance id>"}` for a whole device, or
`{"id": "...", "core": <1..100>, "memory": <1..100>}` for a TDM slice.

Version skew (docs/protocol.md): fields are only added, never renamed or re-typed, and
a reader ignores the fields it does not know: a share's unknown keys, and top-level
keys with a `/` (a container name has none), kept for fields of the whole pod.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar


class AssignmentError(ValueError):
    """A malformed assignment annotation; the message says what is wrong."""


@dataclass(frozen=True, order=True)
class DeviceShare:
    """What one container gets of one device: the whole device, or a slice."""

    device_id: str
    core_percent: int = 0
    memory_percent: int = 0

    @property
    def whole(self) -> bool:
        """True when the whole device (or MIG instance) is given."""
        return self.core_percent == 0 and self.memory_percent == 0


BIND_PHASE_ALLOCATING = "allocating"
"""`annotations.bind_phase` written by the scheduler with the assignment, before binding."""
BIND_PHASE_ALLOCATED = "allocated"
"""`annotations.bind_phase` written by the Device Plugin once every device container of the
pod is allocated: the pod's admission is settled (docs/protocol.md)."""

ADMISSION_SERIAL = "serial"
"""`annotations.node_admission`: the node's Device Plugin sees every pod bound to the node
(API server pod source), so the scheduler binds one device pod at a time there."""
ADMISSION_KUBELET_ORDER = "kubelet-order"
"""`annotations.node_admission`: the node's Device Plugin reads the kubelet's own pod list,
where a pod appears as the kubelet starts admitting it, one pod at a time; device pods may
be bound there without waiting for each other (docs/protocol.md)."""

ASSIGNED_POD_UID = "lj-runtimekit.io/assigned-pod-uid"
"""Pod annotation the scheduler writes with the assignment: the UID of the pod it was made
for, so that a copy on another pod is refused. A fixed key, not a protocol key: older
components refuse a `protocol.yaml` that names a key they do not know."""

PodAssignment = Mapping[str, tuple[DeviceShare, ...]]
"""Container name -> the device shares it gets."""

K = TypeVar("K", bound=Hashable)


def peak_use(
    init_containers: Iterable[tuple[bool, Mapping[K, int]]],
    app_containers: Iterable[Mapping[K, int]],
) -> dict[K, int]:
    """What a pod holds of each resource at its peak, as Kubernetes counts it.

    `init_containers` in declared order, each (restartable, use). Init containers run one
    after another before the app containers; a restartable one (a sidecar) keeps running
    beside everything declared after it. The peak is the largest of: per init container,
    its use plus that of the sidecars declared before it; all sidecars plus all app
    containers. The kubelet's device manager holds devices by the same rule.
    """
    sidecars: dict[K, int] = {}
    peak: dict[K, int] = {}
    for restartable, use in init_containers:
        for k, v in use.items():
            if restartable:
                sidecars[k] = sidecars.get(k, 0) + v
            else:
                peak[k] = max(peak.get(k, 0), sidecars.get(k, 0) + v)
    total = dict(sidecars)
    for use in app_containers:
        for k, v in use.items():
            total[k] = total.get(k, 0) + v
    for k, v in peak.items():
        total[k] = max(total.get(k, 0), v)
    return total


def pod_shares(
    assignment: PodAssignment, init_containers: Sequence[tuple[str, bool]] = ()
) -> tuple[DeviceShare, ...]:
    """What the whole pod holds on the node, per device.

    `init_containers`: the pod's init containers in declared order, each (name,
    restartable); the other containers of `assignment` are app containers. The kubelet
    hands a finished init container's devices to the containers started after it, so per
    device the pod holds its `peak_use`. A device (or MIG instance) given whole is listed
    once.
    """
    whole: dict[str, None] = {}
    use: dict[str, dict[tuple[str, int], int]] = {}
    for container, shares in sorted(assignment.items()):
        mine = use.setdefault(container, {})
        for share in shares:
            if share.whole:
                whole[share.device_id] = None
                continue
            for key, pct in (
                ((share.device_id, 0), share.core_percent),
                ((share.device_id, 1), share.memory_percent),
            ):
                mine[key] = mine.get(key, 0) + pct
    init = {name for name, _ in init_containers}
    peak = peak_use(
        ((restartable, use.get(name, {})) for name, restartable in init_containers),
        (u for name, u in use.items() if name not in init),
    )
    out = [DeviceShare(d) for d in whole]
    for device in sorted({d for d, _ in peak}):
        if device not in whole:
            out.append(DeviceShare(device, peak.get((device, 0), 0), peak.get((device, 1), 0)))
    return tuple(out)


def foreign_assignment(annotations: Mapping[str, str], pod_uid: str) -> str | None:
    """The pod UID the assignment annotations were written for, when it is not `pod_uid`
    (they were copied from another pod); None for the pod's own, or for annotations
    without a UID (written by a scheduler older than `ASSIGNED_POD_UID`)."""
    owner = annotations.get(ASSIGNED_POD_UID)
    return owner if owner is not None and owner != pod_uid else None


def encode_assignment(assignment: PodAssignment) -> str:
    """Encode an assignment as compact, key-sorted JSON."""
    out: dict[str, list[dict[str, object]]] = {}
    for container, shares in sorted(assignment.items()):
        items: list[dict[str, object]] = []
        for share in shares:
            item: dict[str, object] = {"id": share.device_id}
            if not share.whole:
                item["core"] = share.core_percent
                item["memory"] = share.memory_percent
            items.append(item)
        out[container] = items
    return json.dumps(out, separators=(",", ":"), sort_keys=True)


def _percent(item: Mapping[str, object], key: str, where: str) -> int:
    value = item.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise AssignmentError(f"{where}.{key}: must be an integer 0..100, got {value!r}")
    return value


def decode_assignment(text: str) -> dict[str, tuple[DeviceShare, ...]]:
    """Decode an assignment annotation; raise AssignmentError naming the bad part.

    Fields it does not know are ignored (a newer writer's, docs/protocol.md); the known
    ones must have their type."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AssignmentError(f"not valid JSON: {exc.msg} at character {exc.pos}") from exc
    if not isinstance(data, dict):
        raise AssignmentError("must be a JSON object of container name -> list of devices")
    result: dict[str, tuple[DeviceShare, ...]] = {}
    for container, items in data.items():
        if "/" in container:
            continue
        if not isinstance(items, list):
            raise AssignmentError(f"{container}: must be a list of devices")
        shares: list[DeviceShare] = []
        for i, item in enumerate(items):
            where = f"{container}[{i}]"
            if not isinstance(item, dict):
                raise AssignmentError(f"{where}: must be an object with an 'id'")
            device_id = item.get("id")
            if not isinstance(device_id, str) or not device_id:
                raise AssignmentError(f"{where}.id: must be a non-empty string")
            shares.append(
                DeviceShare(
                    device_id, _percent(item, "core", where), _percent(item, "memory", where)
                )
            )
        result[str(container)] = tuple(shares)
    return result
