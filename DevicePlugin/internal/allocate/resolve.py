"""Which pod and container a kubelet call is for, without guessing (pure logic).

The kubelet's Allocate names device IDs, not a pod. The identity comes from
the admission protocol (docs/protocol.md): the Scheduler Framework binds at
most one device pod per node at a time and binds the next only once it has
seen the outcome of the previous one (allocated, failed, or deleted). So the
node has at most one pod **waiting for devices**: active, asking for the
plugin's resources, not yet served all of them. That pod is the one the
kubelet is admitting.

Within that pod the kubelet goes through the init containers, then the app
containers, in spec order, and for each through its device resources; the
container of a call is the first one in that order that asks for the call's
resource and has not been served it yet.

Where the pod list shows more than one waiting pod (the kubelet's copy lags
behind a rejection; two schedulers; a pod bound around the scheduler) the
caller asks the API server, and if that still leaves several, refuses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from lj_runtimekit.deviceplugin.internal.podlookup.lookup import ContainerInfo, PodInfo
from lj_runtimekit.proto.pkg.protocol import (
    BIND_PHASE_ALLOCATED,
    AssignmentError,
    DeviceShare,
    decode_assignment,
)
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID, foreign_assignment

DoneKey = tuple[str, str, str]
"""(pod uid, container name, resource name): what the kubelet already got."""


@dataclass(frozen=True)
class Waiting:
    """A pod waiting for its devices, with the scheduler's assignment."""

    pod: PodInfo
    assignment: Mapping[str, tuple[DeviceShare, ...]] | None
    """Container -> shares; None when the pod carries no assignment (not placed by us)."""
    problem: str | None
    """Why the assignment cannot be used (malformed)."""


@functools.lru_cache(maxsize=4096)
def _decode(text: str) -> Mapping[str, tuple[DeviceShare, ...]] | str:
    """The decoded assignment, or the reason it is malformed (cached by text)."""
    try:
        return decode_assignment(text)
    except AssignmentError as exc:
        return str(exc)


def device_containers(pod: PodInfo, served: Callable[[str], bool]) -> list[tuple[str, str]]:
    """(container, resource) pairs of the pod the kubelet allocates from this plugin, in the
    kubelet's order."""
    return [(c.name, r) for c in pod.containers for r in c.limits if served(r) and c.limits[r] > 0]


def waiting_pods(
    pods: Iterable[PodInfo],
    served: Callable[[str], bool],
    done: Collection[DoneKey],
    assigned_key: str,
    bind_phase_key: str,
    *,
    require_uid: bool = False,
) -> list[Waiting]:
    """The active pods that ask for the plugin's resources and have not got all of them.

    A pod whose assignment was written for another pod (copied, with its `allocated`
    phase or not) waits like any other, with that as its problem; with `require_uid`, so
    does one whose assignment names no pod (an older scheduler's, or a copy whose UID was
    removed)."""
    out: list[Waiting] = []
    for pod in pods:
        owner = foreign_assignment(pod.annotations, pod.uid)
        unbound = (
            require_uid
            and assigned_key in pod.annotations
            and ASSIGNED_POD_UID not in pod.annotations
        )
        settled = pod.annotations.get(bind_phase_key) == BIND_PHASE_ALLOCATED
        if not pod.active or (settled and owner is None and not unbound):
            continue
        pairs = device_containers(pod, served)
        if not pairs or all((pod.uid, c, r) in done for c, r in pairs):
            continue
        text = pod.annotations.get(assigned_key)
        assignment: Mapping[str, tuple[DeviceShare, ...]] | None = None
        problem = None
        if owner is not None:
            problem = (
                f"annotation {assigned_key} of pod {pod.ref} was written by the scheduler for"
                f" the pod with UID {owner}, not for this one ({pod.uid}): it was copied from"
                " another pod; a device pod must be placed by the Runtime Kit scheduler"
            )
        elif unbound:
            problem = (
                f"annotation {assigned_key} of pod {pod.ref} names no pod ({ASSIGNED_POD_UID}"
                " is missing): it was written by a scheduler older than this Device Plugin or"
                " copied from another pod, and --require-assignment-uid refuses both"
            )
        elif text is not None:
            decoded = _decode(text)
            if isinstance(decoded, str):
                problem = f"annotation {assigned_key} of pod {pod.ref} is malformed: {decoded}"
            else:
                assignment = decoded
        out.append(Waiting(pod, assignment, problem))
    return out


def next_container(pod: PodInfo, resource: str, done: Collection[DoneKey]) -> ContainerInfo | None:
    """The first container, in the kubelet's order, that asks for `resource` and has not been
    served it."""
    for c in pod.containers:
        if c.limits.get(resource, 0) > 0 and (pod.uid, c.name, resource) not in done:
            return c
    return None
