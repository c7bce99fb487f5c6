"""What the pods of the node were given, read from their assignment annotations.

The Device Plugin records what it really allocated in
`annotations.allocated_devices`; before that, the scheduler's choice is in
`annotations.assigned_devices`. Both use the shared encoding of
`lj_runtimekit.proto.pkg.protocol.assignment`. A whole device counts as 100 %
core and 100 % memory. Sums are reported as they are: a device whose slices
add up to more than 100 % shows a ratio above 1 (an over-commit to alert on).

In DRA mode the Runtime holds one allocation per ResourceClaim (`with_claims`): its
devices are counted once in the device sums however many containers share the claim,
and its shares are given to every container using it (the kubelet's PodResources).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lj_runtimekit.exporter.internal.pods.model import Pod
from lj_runtimekit.exporter.internal.pods.podresources import ClaimKey, ClaimUser
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
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
    claim_users: Mapping[str, tuple[ContainerRef, ...]] = field(default_factory=dict)
    """DRA claim UID -> the containers using the claim (empty: none known yet)."""


def share_percents(share: DeviceShare) -> tuple[int, int]:
    """(core %, memory %) of a share; a whole device is 100/100."""
    if share.whole:
        return WHOLE_PERCENT, WHOLE_PERCENT
    return share.core_percent, share.memory_percent


def runtime_share(device: pb.DeviceRequest) -> DeviceShare:
    """A device the Runtime reserved as a share (DeviceRequest: a slice's percents are
    literal; without `slice`, 0 or 100 of both means the whole device)."""
    core, memory = device.core_percent, device.memory_percent
    if not device.slice and {core or WHOLE_PERCENT, memory or WHOLE_PERCENT} == {WHOLE_PERCENT}:
        return DeviceShare(device.device_id)
    if not device.slice:
        core, memory = core or WHOLE_PERCENT, memory or WHOLE_PERCENT
    return DeviceShare(device.device_id, core, memory)


def with_claims(
    base: Allocations,
    claims: Iterable[pb.Allocation],
    users: Mapping[ClaimKey, Sequence[ClaimUser]],
    pods: Iterable[Pod],
) -> Allocations:
    """`base` plus the Runtime's DRA claim allocations: a claim's shares go to every active
    container using it (`users`: PodResources, by claim namespace and name); each claim
    counts once in its devices' core and memory sums, and `containers` counts its users."""
    uid_of = {(p.namespace, p.name): p.uid for p in pods if p.active}
    by_container = {ref: dict(held) for ref, held in base.by_container.items()}
    sums = {k: [v.core_percent, v.memory_percent, v.containers] for k, v in base.by_device.items()}
    claim_users: dict[str, tuple[ContainerRef, ...]] = {}
    for claim in claims:
        refs = tuple(
            (uid, user.container)
            for user in users.get((claim.pod_namespace, claim.claim_name), ())
            if (uid := uid_of.get((user.pod_namespace, user.pod_name))) is not None
        )
        claim_users[claim.claim_uid] = refs
        for device in claim.devices:
            share = runtime_share(device)
            core, memory = share_percents(share)
            total = sums.setdefault(share.device_id, [0, 0, 0])
            total[0] += core
            total[1] += memory
            total[2] += len(refs)
            for ref in refs:
                by_container.setdefault(ref, {})[share.device_id] = share
    return Allocations(
        by_container=by_container,
        by_device={k: DeviceAllocation(v[0], v[1], v[2]) for k, v in sums.items()},
        problems=base.problems,
        claim_users=claim_users,
    )


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
