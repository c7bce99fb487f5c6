"""The sharing invariant, checked the same way everywhere (docs/architecture.md).

On every device: the core slices sum to at most 100 %, the memory slices to at
most 100 %, and a device (or MIG instance) given whole has one holder and no
slice. Tests, benchmarks and the sandbox feed it the holdings they read: the
scheduler's assignments, the Device Plugin's records or the Runtime's
allocations.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2
from lj_runtimekit.proto.pkg.protocol import (
    AssignmentError,
    DeviceShare,
    Protocol,
    decode_assignment,
    pod_shares,
)
from lj_runtimekit.runtimesim.injection import ANNOTATION_PREFIX

Holding = tuple[str, str, DeviceShare]
"""(node, holder, share): a holder (pod or container) holds `share` of a device on node."""


def sharing_violations(source: str, holdings: Iterable[Holding]) -> list[str]:
    """One line per breach of the invariant, each starting with `source`; empty when it holds.

    A share of 100 % core and 100 % memory counts as the whole device.
    """
    whole: dict[tuple[str, str], list[str]] = {}
    core: dict[tuple[str, str], int] = {}
    memory: dict[tuple[str, str], int] = {}
    sliced: dict[tuple[str, str], list[str]] = {}
    for node, owner, share in holdings:
        key = (node, share.device_id)
        if share.whole or (share.core_percent >= 100 and share.memory_percent >= 100):
            whole.setdefault(key, []).append(owner)
        else:
            core[key] = core.get(key, 0) + share.core_percent
            memory[key] = memory.get(key, 0) + share.memory_percent
            sliced.setdefault(key, []).append(owner)
    out = []
    for key, owners in whole.items():
        if len(owners) > 1:
            out.append(f"{source}: device {key[1]} on {key[0]} given whole to {owners}")
        if key in sliced:
            out.append(
                f"{source}: device {key[1]} on {key[0]} given whole to {owners} and sliced"
                f" for {sliced[key]}"
            )
    for key, total in core.items():
        if total > 100 or memory[key] > 100:
            out.append(
                f"{source}: device {key[1]} on {key[0]} has {total}% core, {memory[key]}%"
                f" memory in slices ({sliced[key]})"
            )
    return out


def init_containers(pod: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    """The pod's init containers as declared, each (name, restartable): what `pod_shares`
    needs to count a sidecar beside the init containers declared after it."""
    return tuple(
        (c["name"], c.get("restartPolicy") == "Always")
        for c in pod.get("spec", {}).get("initContainers") or ()
    )


def assignment_holdings(pods: Iterable[Mapping[str, Any]], protocol: Protocol) -> list[Holding]:
    """What the scheduler's assignment annotation gives every bound pod, per device (an init
    container's devices are reused by the containers started after it, as the kubelet
    does: `pod_shares`)."""
    out: list[Holding] = []
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        meta = pod["metadata"]
        text = (meta.get("annotations") or {}).get(protocol.annotations.assigned_devices)
        if not node or not text:
            continue
        owner = f"{meta.get('namespace', '')}/{meta['name']}"
        shares = pod_shares(decode_assignment(text), init_containers(pod))
        out += [(node, owner, share) for share in shares]
    return out


CONTAINER_KEY = f"{ANNOTATION_PREFIX}container-key"
"""The injection spec's annotation naming the Runtime allocation (`<pod uid>/<container>`)."""
VISIBLE_DEVICES = "LJ_VISIBLE_DEVICES"


@dataclass(frozen=True)
class KubeletSpec:
    """One entry of the kubelet's device checkpoint: the device IDs it passed for one
    container and resource, and what the device plugin answered (envs, annotations)."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str]
    annotations: Mapping[str, str]


def checkpoint_specs(text: str) -> list[KubeletSpec]:
    """The entries of a kubelet device manager checkpoint (`kubelet_internal_checkpoint`)."""
    out: list[KubeletSpec] = []
    for entry in json.loads(text)["Data"]["PodDeviceEntries"] or ():
        response = api_pb2.ContainerAllocateResponse()
        response.ParseFromString(base64.b64decode(entry.get("AllocResp") or ""))
        ids = [d for per_numa in (entry.get("DeviceIDs") or {}).values() for d in per_numa]
        out.append(
            KubeletSpec(
                entry["PodUID"],
                entry["ContainerName"],
                entry["ResourceName"],
                tuple(sorted(ids)),
                dict(response.envs),
                dict(response.annotations),
            )
        )
    return out


def foreign_specs(
    specs: Iterable[KubeletSpec], pods: Iterable[Mapping[str, Any]], protocol: Protocol
) -> list[str]:
    """One line per running container (app or sidecar of a Running pod) the kubelet injected
    another container's spec into: a container key that is not `<its pod uid>/<its name>`,
    or visible devices outside its own pod's assignment."""
    running: dict[str, tuple[str, frozenset[str], set[str]]] = {}
    for pod in pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        names = {c["name"] for c in spec.get("containers") or ()}
        names |= {name for name, restartable in init_containers(pod) if restartable}
        text = (meta.get("annotations") or {}).get(protocol.annotations.assigned_devices)
        try:
            assigned = decode_assignment(text) if text else {}
        except AssignmentError:
            assigned = {}
        devices = {s.device_id for shares in assigned.values() for s in shares}
        running[meta["uid"]] = (f"{meta['namespace']}/{meta['name']}", frozenset(names), devices)
    out = []
    for spec in specs:
        if spec.pod_uid not in running or spec.container not in running[spec.pod_uid][1]:
            continue
        ref, _, devices = running[spec.pod_uid]
        where = f"pod {ref} container {spec.container} ({spec.resource})"
        key = spec.annotations.get(CONTAINER_KEY)
        if key != f"{spec.pod_uid}/{spec.container}":
            out.append(f"{where}: container key {key!r}")
        visible = {d for d in spec.envs.get(VISIBLE_DEVICES, "").split(",") if d}
        if not visible or not visible <= devices:
            shown = ",".join(sorted(visible)) or "none"
            out.append(f"{where}: visible devices {shown}, its pod's assignment {sorted(devices)}")
    return out
