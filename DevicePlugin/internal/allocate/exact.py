"""Exactly the kubelet's devices: the container a call is for, and what it gets, checked
against the scheduler's assignment of the pod, or the call is refused (docs/protocol.md,
"Container" and "Exactly the kubelet's devices")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from lj_runtimekit.deviceplugin.internal.allocate.ledger import Ledger, describe
from lj_runtimekit.deviceplugin.internal.allocate.resolve import Waiting, next_container
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import ContainerInfo
from lj_runtimekit.deviceplugin.internal.rm.resources import (
    ResourceInfo,
    ResourceKind,
    slice_unit_device,
)
from lj_runtimekit.proto.pkg.protocol import DeviceShare, Protocol
from lj_runtimekit.proto.pkg.runtimeclient import normalize


def resolve_call(
    w: Waiting,
    info: ResourceInfo,
    ids: Sequence[str],
    ledger: Ledger,
    protocol: Protocol,
    node: str,
) -> tuple[ContainerInfo, tuple[DeviceShare, ...]]:
    """The container of the pod in admission this call is for, and what it gets; or
    AllocationError saying why the call cannot be served exactly."""
    pod = w.pod
    container = next_container(pod, info.name, ledger.done())
    if container is None:
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"pod {pod.ref} is admitted on node {node} but none of its containers"
            f" still waits for {info.name} (the kubelet asks for {len(ids)})",
        )
    ref = f"pod {pod.ref} container {container.name}"
    asked = container.limits[info.name]
    if asked != len(ids):
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the kubelet asks for {len(ids)} of {info.name}, but the next container of the"
            f" pod in admission ({ref}) asks for {asked}",
        )
    if w.problem is not None:
        raise AllocationError(grpc.StatusCode.FAILED_PRECONDITION, w.problem)
    key = protocol.annotations.assigned_devices
    if w.assignment is None:
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{ref} asks for {len(ids)} of {info.name} but carries no"
            f" {key} annotation: it was not placed"
            " by the Runtime Kit scheduler (spec.nodeName set at creation, or another"
            " scheduler); device pods must be scheduled by it so that no device is given"
            " to two pods",
        )
    if container.name not in w.assignment:
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"annotation {key} of pod {pod.ref} has"
            f" no entry for container {container.name}, which asks for {asked} of"
            f" {info.name}",
        )
    part = container_part(w.assignment, container, info, ids, ref, ledger, key)
    clash = sorted(ledger.clash_set(pod, container) & {s.device_id for s in part})
    if clash:
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the kubelet passes {', '.join(clash)} for {ref}, which another container of"
            " the pod that runs beside it already holds",
        )
    return container, part


def pool(
    assignment: Mapping[str, tuple[DeviceShare, ...]], info: ResourceInfo, ledger: Ledger
) -> set[str]:
    """Every whole device (or MIG instance) of `info` assigned to any container of the pod."""
    return {
        s.device_id
        for shares in assignment.values()
        for s in shares
        if s.whole and info.name in ledger.resource_of(s)
    }


def container_part(
    assignment: Mapping[str, tuple[DeviceShare, ...]],
    container: ContainerInfo,
    info: ResourceInfo,
    ids: Sequence[str],
    ref: str,
    ledger: Ledger,
    key: str,
) -> tuple[DeviceShare, ...]:
    """What the container gets for this call: exactly the kubelet's IDs, when they agree
    with the scheduler's assignment (annotation `key`) of the pod; AllocationError
    otherwise."""
    refuse = grpc.StatusCode.FAILED_PRECONDITION
    if info.kind in (ResourceKind.CORE, ResourceKind.MEMORY):
        own = assignment.get(container.name, ())
        sliced = [s for s in own if not s.whole]
        if len(sliced) != 1 or len(own) != 1:
            raise AllocationError(
                refuse,
                f"{ref} asks for {len(ids)} of {info.name} but annotation {key} gives it"
                f" {describe(own)}; a slice container gets one slice of one device",
            )
        share = sliced[0]
        got = share.core_percent if info.kind == ResourceKind.CORE else share.memory_percent
        if got != len(ids):
            raise AllocationError(
                refuse,
                f"{ref} asks for {len(ids)} of {info.name} but annotation {key} gives it"
                f" {got}% {info.kind.value} of device {share.device_id}",
            )
        parents = sorted({slice_unit_device(u) or u for u in ids})
        if parents != [share.device_id]:
            raise AllocationError(
                refuse,
                f"the kubelet passes {info.name} units of {', '.join(parents)} for {ref},"
                f" but the scheduler assigned it a slice of {share.device_id}: the kubelet's"
                " record and the container's devices would differ",
            )
        return (normalize(share),)
    whole = pool(assignment, info, ledger)
    outside = sorted(d for d in ids if d not in whole)
    if outside:
        raise AllocationError(
            refuse,
            f"the kubelet passes {info.name} {', '.join(outside[:4])} for {ref}, which the"
            f" scheduler did not assign to the pod (its {info.name}:"
            f" {', '.join(sorted(whole)) or 'none'}): the kubelet's record and the"
            " container's devices would differ",
        )
    return tuple(DeviceShare(d) for d in ids)
