"""What the pods of the node were given, read from their assignment annotations.

The Device Plugin records what it really allocated in
`annotations.allocated_devices`; before that, the scheduler's choice is in
`annotations.assigned_devices`. Both use the shared encoding of
`lj_runtimekit.proto.pkg.protocol.assignment`. A whole device counts as 100 %
core and 100 % memory. Sums are reported as they are: a device whose slices
add up to more than 100 % shows a ratio above 1 (an over-commit to alert on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lj_runtimekit.exporter.internal.pods.model import Pod
from lj_runtimekit.proto.pkg.protocol import (
    Annotations,
    AssignmentError,
    DeviceShare,
    decode_assignment,
)

WHOLE_PERCENT = 100

ContainerRef = tuple[str, str]
"""(pod UID, container name)."""


@dataclass(frozen=True)
class DeviceAllocation:
    """The sum of what the containers of the node hold on one device or MIG instance."""

    core_percent: int
    memory_percent: int
    containers: int


@dataclass(frozen=True)
class Allocations:
    """The node's allocations: per container and per device (or MIG instance) ID."""

    by_container: Mapping[ContainerRef, Mapping[str, DeviceShare]]
    by_device: Mapping[str, DeviceAllocation]
    problems: tuple[str, ...] = ()


def share_percents(share: DeviceShare) -> tuple[int, int]:
    """(core %, memory %) of a share; a whole device is 100/100."""
    if share.whole:
        return WHOLE_PERCENT, WHOLE_PERCENT
    return share.core_percent, share.memory_percent


def pod_allocations(pods: Iterable[Pod], annotations: Annotations) -> Allocations:
    """Decode the assignment annotation of every active pod and add the shares up."""
    by_container: dict[ContainerRef, dict[str, DeviceShare]] = {}
    sums: dict[str, list[int]] = {}
    problems: list[str] = []
    for pod in pods:
        if not pod.active:
            continue
        key = annotations.allocated_devices
        text = pod.annotations.get(key)
        if text is None:
            key = annotations.assigned_devices
            text = pod.annotations.get(key)
        if text is None:
            continue
        try:
            assignment = decode_assignment(text)
        except AssignmentError as exc:
            problems.append(f"pod={pod.ref} annotation {key}: {exc}")
            continue
        for container, shares in assignment.items():
            held = by_container.setdefault((pod.uid, container), {})
            for share in shares:
                held[share.device_id] = share
                core, memory = share_percents(share)
                total = sums.setdefault(share.device_id, [0, 0, 0])
                total[0] += core
                total[1] += memory
                total[2] += 1
    return Allocations(
        by_container=by_container,
        by_device={k: DeviceAllocation(v[0], v[1], v[2]) for k, v in sums.items()},
        problems=tuple(problems),
    )
