"""Choosing devices on one node: the heavy logic of the GpuShare plugin (pure, no I/O).

`assign` works on a scratch view of the node's free devices, so trying a node
changes nothing; the plugin applies the result to the cache at Reserve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from lj_runtimekit.proto.pkg.protocol import DeviceShare, pod_shares
from lj_runtimekit.schedulerframework.internal.cache.devices import DeviceState, NodeDevices
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import (
    ContainerAsk,
    DeviceRequest,
)

SetChooser = Callable[[Sequence[DeviceState], int, str], list[DeviceState]]
"""(free devices, how many, policy) -> the chosen devices (DeviceTopology supplies one)."""


def choose_in_order(free: Sequence[DeviceState], count: int, policy: str) -> list[DeviceState]:
    """No topology: binpack takes the lowest indexes, spread spreads over NUMA nodes."""
    if policy == "spread":
        by_numa: dict[int, list[DeviceState]] = {}
        for d in free:
            by_numa.setdefault(d.numa, []).append(d)
        out: list[DeviceState] = []
        groups = [by_numa[k] for k in sorted(by_numa)]
        while len(out) < count:
            for g in groups:
                if g and len(out) < count:
                    out.append(g.pop(0))
        return sorted(out, key=lambda d: d.index)
    return list(free[:count])


def assign(
    devices: NodeDevices,
    request: DeviceRequest,
    policy: str,
    chooser: SetChooser | None = None,
) -> dict[str, tuple[DeviceShare, ...]] | None:
    """Devices for every container of the pod on this node, or None when they do not fit.

    Init containers that run to completion get the pod's own devices, as the kubelet's
    device manager hands them to the containers started after them: whole devices and MIG
    instances from the app containers' and sidecars' (more only when they ask for more),
    never those of a sidecar declared before the init container (it runs beside it); and
    when an init container asks for a slice, every slice of the pod is placed on one device.
    """
    choose = chooser or choose_in_order
    taken: set[str] = set()
    slice_used: dict[str, tuple[int, int]] = {}
    mig_taken: set[str] = set()
    pod_whole: dict[str, list[str]] = {}
    pod_mig: dict[str, list[str]] = {}
    out: dict[str, tuple[DeviceShare, ...]] = {}
    slices_together = any(a.reuse and a.is_slice for a in request.asks)
    if slices_together:
        placed = _slices_on_one_device(devices, request, policy)
        if placed is None:
            return None
        for container, placed_shares in placed.items():
            out[container] = placed_shares
            slice_used[placed_shares[0].device_id] = (1, 1)  # no longer wholly free
    order = sorted(
        request.asks, key=lambda a: (a.reuse, 0 if a.whole else 1 if a.mig else 2, -a.whole)
    )
    for ask in order:
        if ask.whole:
            own = pod_whole.setdefault(ask.kind, [])
            reused = _reusable(request.asks, ask, own, out)[: ask.whole]
            need = ask.whole - len(reused)
            free = [
                d
                for d in devices.devices
                if d.kind == ask.kind
                and d.wholly_free
                and d.id not in taken
                and d.id not in slice_used
            ]
            if len(free) < need:
                return None
            chosen = [d.id for d in choose(free, need, policy)] if need else []
            taken.update(chosen)
            own.extend(chosen)
            out[ask.container] = tuple(DeviceShare(d) for d in [*reused, *chosen])
        elif ask.mig:
            shares: list[DeviceShare] = []
            for profile, count in ask.mig:
                own = pod_mig.setdefault(profile, [])
                reused = _reusable(request.asks, ask, own, out)[:count]
                shares.extend(DeviceShare(m) for m in reused)
                for _ in range(count - len(reused)):
                    mig = _pick_mig(devices, profile, policy, mig_taken)
                    if mig is None:
                        return None
                    mig_taken.add(mig)
                    own.append(mig)
                    shares.append(DeviceShare(mig))
            out[ask.container] = tuple(shares)
        elif not slices_together:
            best = _best_slice_device(
                devices, ask.kind, ask.core, ask.memory, policy, taken, slice_used
            )
            if best is None:
                return None
            c, m = slice_used.get(best.id, (0, 0))
            slice_used[best.id] = (c + ask.core, m + ask.memory)
            out[ask.container] = (DeviceShare(best.id, ask.core, ask.memory),)
    return out


def _reusable(
    asks: Sequence[ContainerAsk],
    ask: ContainerAsk,
    own: Sequence[str],
    out: Mapping[str, tuple[DeviceShare, ...]],
) -> list[str]:
    """The pod's devices (or MIG instances) `ask` may reuse: none unless it is an init
    container that runs to completion, and never those of a sidecar declared before it."""
    if not ask.reuse:
        return []
    beside = {
        s.device_id for a in asks[: asks.index(ask)] if a.sidecar for s in out.get(a.container, ())
    }
    return [d for d in own if d not in beside]


def _best_slice_device(
    devices: NodeDevices,
    kind: str,
    core: int,
    memory: int,
    policy: str,
    taken: set[str],
    slice_used: dict[str, tuple[int, int]],
) -> DeviceState | None:
    """The sliceable device with room for (core, memory): tightest (binpack) or roomiest."""
    best: DeviceState | None = None
    best_key: tuple[int, int] | None = None
    for d in devices.devices:
        if d.kind != kind or not d.sliceable or d.id in taken:
            continue
        extra_core, extra_mem = slice_used.get(d.id, (0, 0))
        core_free = d.core_free - extra_core
        mem_free = d.memory_free - extra_mem
        if core_free < core or mem_free < memory:
            continue
        room = core_free + mem_free
        key = (room, d.index) if policy == "binpack" else (-room, d.index)
        if best_key is None or key < best_key:
            best, best_key = d, key
    return best


def _slice_peak(request: DeviceRequest) -> tuple[int, int]:
    """(core, memory) the pod's slices hold of one device when placed together: their
    `peak_use` (the kubelet hands an init container's units on)."""
    peak = request.peak(lambda a: {"core": a.core, "memory": a.memory} if a.is_slice else {})
    return peak.get("core", 0), peak.get("memory", 0)


def _slices_on_one_device(
    devices: NodeDevices, request: DeviceRequest, policy: str
) -> dict[str, tuple[DeviceShare, ...]] | None:
    """Every slice ask of the pod on one device, which must hold their `_slice_peak`."""
    sliced = [a for a in request.asks if a.is_slice]
    core, memory = _slice_peak(request)
    best = _best_slice_device(devices, sliced[0].kind, core, memory, policy, set(), {})
    if best is None:
        return None
    return {a.container: (DeviceShare(best.id, a.core, a.memory),) for a in sliced}


def fits_one_slice(devices: NodeDevices, ask: ContainerAsk) -> bool:
    """What `assign` decides for a pod whose only ask is this slice, without building the
    assignment (Filter runs it on every candidate node)."""
    for d in devices.devices:  # a plain loop: any() over a generator costs more per node
        if (
            d.kind == ask.kind
            and d.sliceable
            and d.core_free >= ask.core
            and d.memory_free >= ask.memory
        ):
            return True
    return False


def _pick_mig(devices: NodeDevices, profile: str, policy: str, taken: set[str]) -> str | None:
    best: str | None = None
    best_key: tuple[int, int] | None = None
    for d in devices.devices:
        if not d.healthy or d.mode != "mig" or d.whole or d.slices:
            continue  # a GPU still given whole or sliced (its mode just changed) offers nothing
        free = [
            m
            for m, p in d.mig_profiles.items()
            if p == profile and m not in d.mig_used and m not in taken
        ]
        if not free:
            continue
        busy = len(d.mig_used) + sum(1 for m in d.mig_profiles if m in taken)
        key = (-busy, d.index) if policy == "binpack" else (busy, d.index)
        if best_key is None or key < best_key:
            best, best_key = sorted(free)[0], key
    return best


def copies_that_fit(devices: NodeDevices, request: DeviceRequest, policy: str, limit: int) -> int:
    """How many pods asking `request` the node's devices hold, placed one after another as
    `assign` places them (at most `limit`): what a gang plans its members from. Two 60 %
    slices never share a GPU, so an 8-GPU node holds 8 of them, whatever its 800 % of core.

    A pod of one slice (or whose slices go on one device) and a pod of MIG instances are
    counted; other pods are placed on a scratch copy of the devices."""
    asks = request.asks
    if request.only_slices and (len(asks) == 1 or any(a.reuse for a in asks)):
        core, memory = _slice_peak(request)
        n = 0
        for d in devices.devices:
            if d.kind == asks[0].kind and d.sliceable:
                n += min(
                    d.core_free // core if core else limit,
                    d.memory_free // memory if memory else limit,
                )
        return min(n, limit)
    if all(a.mig for a in asks):
        need = request.peak(lambda a: dict(a.mig))
        return min(
            limit, *(len(devices.free_mig(profile)) // count for profile, count in need.items())
        )
    scratch = NodeDevices(
        [
            dataclasses.replace(
                d, whole=set(d.whole), slices=dict(d.slices), mig_used=dict(d.mig_used)
            )
            for d in devices.devices
        ],
        devices.from_inventory,
    )
    init_order = [(a.container, a.sidecar) for a in asks if a.reuse or a.sidecar]
    n = 0
    while n < limit:
        placed = assign(scratch, request, policy)
        if placed is None:
            break
        scratch.apply(f"copy-{n}", pod_shares(placed, init_order))
        n += 1
    return n
