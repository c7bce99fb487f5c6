"""Which pending container a kubelet call is for (pure logic; the protocol of the README).

The kubelet's Allocate names device IDs, not a pod. The candidates for a
call to resource R with n device IDs are the containers of the node's active
pods that ask for exactly n of R and have not been allocated R yet.

With the kubelet's own `/pods` there is normally exactly one: the kubelet
adds a pod to its pod manager (which `/pods` serves) immediately before
admitting it, one pod at a time, so pods bound later, or later in the same
batch, are not listed yet. Several candidates appear with the API server
fallback (every pod bound to the node) or after lost plugin state; they are
ordered as the kubelet admits them:

1. pods the plugin is in the middle of (some container or resource already
   allocated): the kubelet finishes a pod before the next;
2. creation time (the kubelet sorts each batch of new pods by it), then the
   scheduler's assume time (`annotations.assume_time`: the bind order, which
   is the arrival order that breaks creation-time ties);
3. namespace/name, then container position.

Within that order, identity by devices wins: a candidate whose assignment is
exactly the kubelet's device IDs (whole devices, MIG instances), or whose one
slice is on the device all the kubelet's unit IDs belong to, is taken before
any other. GetPreferredAllocation steers the kubelet to exactly those IDs, so
on a conforming kubelet the call names its pod's assignment.
"""

from __future__ import annotations

import datetime
import functools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from lj_runtimekit.deviceplugin.internal.podlookup.lookup import ContainerInfo, PodInfo
from lj_runtimekit.deviceplugin.internal.rm.resources import (
    ResourceInfo,
    ResourceKind,
    slice_unit_device,
)
from lj_runtimekit.proto.pkg.protocol import AssignmentError, DeviceShare, decode_assignment

DoneKey = tuple[str, str, str]
"""(pod uid, container name, resource name): what the kubelet already got."""


@dataclass(frozen=True)
class Candidate:
    """A container that may be the subject of a kubelet call."""

    pod: PodInfo
    container: ContainerInfo
    shares: tuple[DeviceShare, ...] | None
    """The scheduler's assignment of the container; None when the pod carries none."""
    problem: str | None
    """Why the pod's assignment cannot be used (malformed, no entry for the container)."""
    order: tuple[object, ...]

    @property
    def key(self) -> str:
        """The Runtime's container key, `<pod uid>/<container name>`."""
        return f"{self.pod.uid}/{self.container.name}"

    @property
    def ref(self) -> str:
        """`namespace/name container=<name>` for messages."""
        return f"pod {self.pod.ref} container {self.container.name}"


def _time_key(value: str | None) -> tuple[int, float]:
    """Sort key of a time annotation: unix seconds/ms/ns numbers or RFC 3339; absent last."""
    if not value:
        return (1, 0.0)
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        try:
            parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return (1, 0.0)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.UTC)
        return (0, parsed.timestamp())
    if not math.isfinite(number):
        return (1, 0.0)
    while number > 1e11:  # milliseconds, microseconds or nanoseconds
        number /= 1000
    return (0, number)


@functools.lru_cache(maxsize=4096)
def _decode(text: str) -> Mapping[str, tuple[DeviceShare, ...]] | str:
    """The decoded assignment, or the reason it is malformed (cached by text)."""
    try:
        return decode_assignment(text)
    except AssignmentError as exc:
        return str(exc)


def candidates(
    pods: Iterable[PodInfo],
    resource: str,
    count: int,
    done: Collection[DoneKey],
    in_progress: Collection[str],
    assigned_key: str,
    assume_key: str,
) -> list[Candidate]:
    """Every container that may be the subject of a call for `count` of `resource`, in order."""
    out: list[Candidate] = []
    for pod in pods:
        if not pod.active:
            continue
        wanting = [
            (i, c)
            for i, c in enumerate(pod.containers)
            if c.limits.get(resource) == count and (pod.uid, c.name, resource) not in done
        ]
        if not wanting:
            continue
        text = pod.annotations.get(assigned_key)
        assignment: Mapping[str, tuple[DeviceShare, ...]] | None = None
        pod_problem = None
        if text is not None:
            decoded = _decode(text)
            if isinstance(decoded, str):
                pod_problem = f"annotation {assigned_key} of pod {pod.ref} is malformed: {decoded}"
            else:
                assignment = decoded
        for position, container in wanting:
            shares: tuple[DeviceShare, ...] | None = None
            problem = pod_problem
            if assignment is not None:
                shares = assignment.get(container.name)
                if shares is None:
                    problem = (
                        f"annotation {assigned_key} of pod {pod.ref} has no entry for container"
                        f" {container.name}, which asks for {count} of {resource}"
                    )
            order = (
                0 if pod.uid in in_progress else 1,
                pod.creation,
                _time_key(pod.annotations.get(assume_key)),
                pod.namespace,
                pod.name,
                position,
            )
            out.append(Candidate(pod, container, shares, problem, order))
    out.sort(key=lambda c: c.order)
    return out


def same_devices(candidate: Candidate, info: ResourceInfo, device_ids: Sequence[str]) -> bool:
    """Whether the kubelet's device IDs are exactly the candidate's assignment for `info`."""
    if candidate.shares is None or candidate.problem is not None:
        return False
    if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
        sliced = {s.device_id for s in candidate.shares if not s.whole}
        parents = {slice_unit_device(d) for d in device_ids}
        return len(sliced) == 1 and parents == sliced
    return {s.device_id for s in candidate.shares if s.whole} == set(device_ids)


def choose(
    ordered: Sequence[Candidate], matches: Callable[[Candidate], bool]
) -> tuple[Candidate | None, bool]:
    """The candidate a call is for, and whether identity by devices decided it.

    When the plugin is in the middle of a pod, only that pod's containers are
    considered (the kubelet finishes a pod before the next). Within the group,
    a candidate whose assignment is the call's devices is taken before the
    order alone decides.
    """
    if not ordered:
        return None, False
    group = [c for c in ordered if c.order[0] == ordered[0].order[0]]
    for candidate in group:
        if matches(candidate):
            return candidate, True
    return group[0], False
