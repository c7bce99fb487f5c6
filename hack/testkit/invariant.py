"""The sharing invariant, checked the same way everywhere (docs/architecture.md).

On every device: the core slices sum to at most 100 %, the memory slices to at
most 100 %, and a device (or MIG instance) given whole has one holder and no
slice. Tests, benchmarks and the sandbox feed it the holdings they read: the
scheduler's assignments, the Device Plugin's records or the Runtime's
allocations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lj_runtimekit.proto.pkg.protocol import (
    DeviceShare,
    Protocol,
    decode_assignment,
    pod_shares,
)

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
