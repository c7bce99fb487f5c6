"""The scheduler's view of DRA: the driver's ResourceSlices (pools, generations, counters,
capacity), DeviceClasses, ResourceClaims, and the ledger of what their allocations hold.

Everything is rebuilt from the informers after a restart. An allocation this scheduler
chose is held from Reserve (`assume`) until the claim shows it (or the attempt is given
up, `forget`), so two pods never get one device, nor more than a device's capacity, while
the claim's update is in flight. Callers hold the scheduler cache's lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from lj_runtimekit.schedulerframework.internal.dra.cel import Selectors
from lj_runtimekit.schedulerframework.internal.dra.objects import (
    Allocation,
    Claim,
    CounterKey,
    Device,
    DeviceClass,
    DeviceKey,
    Slice,
    parse_claim,
    parse_class,
    parse_slice,
)

MAX_DEVICE_SELECTIONS = 1 << 16
"""Entries of `DraState.devices_matching` kept (nodes times request shapes); past that the
memo starts again (claims may each have their own selectors)."""

Selection = tuple[tuple[Device, Mapping[str, Decimal] | None], ...]
"""A node's devices a request selects, each with what the request would take of it (None:
it cannot have it)."""


@dataclass
class Usage:
    """What allocations hold of one device."""

    claims: Counter[str] = field(default_factory=Counter)
    """claim UID -> results on this device"""
    consumed: dict[str, Decimal] = field(default_factory=dict)
    """capacity name -> sum consumed (devices that allow several allocations)"""


def _older(new: Claim, old: Claim) -> bool:
    """Whether `new` is an older version than `old` (resourceVersions are etcd revisions;
    compared only when both are numbers, as upstream's assume cache does)."""
    if new.resource_version.isdigit() and old.resource_version.isdigit():
        return int(new.resource_version) < int(old.resource_version)
    return False


class DraState:
    def __init__(self) -> None:
        self.slices: dict[str, Slice] = {}
        self.classes: dict[str, DeviceClass] = {}
        self.claims: dict[str, Claim] = {}
        """namespace/name -> claim"""
        self.claim_objects: dict[str, Mapping[str, Any]] = {}
        """namespace/name -> the claim's object as last seen"""
        self.node_devices: dict[str, tuple[Device, ...]] = {}
        """node -> the devices of its complete pools at their newest generation"""
        self.counter_sets: dict[CounterKey, Mapping[str, Decimal]] = {}
        self._pools: dict[tuple[str, str], set[str]] = {}
        """(driver, pool) -> slice names"""
        self._node_pools: dict[str, set[tuple[str, str]]] = {}
        self._devices: dict[DeviceKey, Device] = {}
        self._usage: dict[DeviceKey, Usage] = {}
        self._in_use: Counter[str] = Counter()
        """node -> how many of its devices are in `_usage` (kept as the ledger changes)"""
        self._shareable: set[str] = set()
        """nodes with a device that allows several allocations"""
        self._held: dict[str, Allocation] = {}
        """claim UID -> the allocation counted in the ledger"""
        self._claim_allocation: dict[str, Allocation] = {}
        """claim UID -> the allocation its object shows"""
        self.assumed: dict[str, tuple[str, Allocation]] = {}
        """claim UID -> (claim key, the allocation this scheduler chose and has not seen)"""
        self.selectors = Selectors()
        """the CEL selectors of classes and claims, compiled once"""
        self.nodes_matching: dict[object, list[str]] = {}
        """memo of the allocator's `candidate_nodes`, emptied when devices or classes change"""
        self.devices_matching: dict[object, tuple[Selection, frozenset[str]]] = {}
        """memo of the allocator: (node, request shape) -> the node's devices selected and
        the selector errors met; emptied with `nodes_matching`"""

    # -- slices --------------------------------------------------------------------------

    def update_slice(self, obj: Mapping[str, Any]) -> str | None:
        """Takes a slice in; returns the node whose devices changed (None: none)."""
        parsed = parse_slice(obj)
        name = str((obj.get("metadata") or {}).get("name", ""))
        old = self.slices.pop(name, None)
        if parsed is None:
            return self._repool(old) if old else None
        self.slices[name] = parsed
        pool = (parsed.driver, parsed.pool)
        self._pools.setdefault(pool, set()).add(name)
        if old is not None and (old.driver, old.pool) != pool:
            self._repool(old)
        return self._rebuild_pool(pool, parsed.node)

    def remove_slice(self, name: str) -> str | None:
        old = self.slices.pop(name, None)
        return self._repool(old) if old else None

    def _repool(self, old: Slice) -> str:
        pool = (old.driver, old.pool)
        names = self._pools.get(pool, set())
        names.discard(old.name)
        return self._rebuild_pool(pool, old.node)

    def _rebuild_pool(self, pool: tuple[str, str], node: str) -> str:
        names = self._pools.get(pool, set())
        slices = [self.slices[n] for n in names if n in self.slices]
        if not slices:
            self._pools.pop(pool, None)
            self._node_pools.get(node, set()).discard(pool)
        else:
            self._node_pools.setdefault(node, set()).add(pool)
        self._rebuild_node(node)
        return node

    def pool_slices(self, pool: tuple[str, str]) -> list[Slice]:
        """The pool's slices of its newest generation, empty while it is incomplete."""
        slices = [self.slices[n] for n in self._pools.get(pool, ()) if n in self.slices]
        if not slices:
            return []
        newest = max(s.generation for s in slices)
        current = [s for s in slices if s.generation == newest]
        return current if len(current) >= current[0].slice_count else []

    def _rebuild_node(self, node: str) -> None:
        self._forget_matches()
        for device in self.node_devices.get(node, ()):
            self._devices.pop(device.key, None)
        devices: list[Device] = []
        for pool in sorted(self._node_pools.get(node, ())):
            for s in self.pool_slices(pool):
                devices += s.devices
                for set_name, counters in s.counter_sets.items():
                    self.counter_sets[(s.driver, s.pool, set_name)] = counters
        if devices:
            self.node_devices[node] = tuple(devices)
        else:
            self.node_devices.pop(node, None)
        for device in devices:
            self._devices[device.key] = device
        self._in_use[node] = sum(1 for d in devices if d.key in self._usage)
        if any(d.allow_multiple for d in devices):
            self._shareable.add(node)
        else:
            self._shareable.discard(node)

    def _forget_matches(self) -> None:
        self.nodes_matching.clear()
        self.devices_matching.clear()

    def device(self, key: DeviceKey) -> Device | None:
        return self._devices.get(key)

    # -- classes -------------------------------------------------------------------------

    def update_class(self, obj: Mapping[str, Any]) -> None:
        parsed = parse_class(obj)
        self.classes[parsed.name] = parsed
        self._forget_matches()

    def remove_class(self, name: str) -> None:
        self.classes.pop(name, None)
        self._forget_matches()

    # -- claims and the ledger -----------------------------------------------------------

    def update_claim(self, obj: Mapping[str, Any]) -> Claim:
        """Takes a claim in; an older version of one already seen (a watch behind this
        scheduler's own update) is ignored."""
        claim = parse_claim(obj)
        old = self.claims.get(claim.key)
        if old is not None and old.uid == claim.uid and _older(claim, old):
            return old
        if old is not None and old.uid != claim.uid:
            self._drop_claim(old)
        self.claims[claim.key] = claim
        self.claim_objects[claim.key] = obj
        if claim.allocation is not None:
            self._claim_allocation[claim.uid] = claim.allocation
            self.assumed.pop(claim.uid, None)  # seen: the object's allocation counts now
        else:
            self._claim_allocation.pop(claim.uid, None)
        self._recount(claim.uid)
        return claim

    def remove_claim(self, key: str) -> Claim | None:
        claim = self.claims.pop(key, None)
        self.claim_objects.pop(key, None)
        if claim is not None:
            self._drop_claim(claim)
        return claim

    def _drop_claim(self, claim: Claim) -> None:
        self._claim_allocation.pop(claim.uid, None)
        self.assumed.pop(claim.uid, None)
        self._recount(claim.uid)

    def assume(self, claim: Claim, allocation: Allocation) -> None:
        """Holds the allocation chosen for `claim` until the claim shows one."""
        self.assumed[claim.uid] = (claim.key, allocation)
        self._recount(claim.uid)

    def forget(self, claim_uid: str) -> None:
        """Gives up an assumed allocation (the attempt failed); the claim's own stays."""
        if self.assumed.pop(claim_uid, None) is not None:
            self._recount(claim_uid)

    def allocation_of(self, claim: Claim) -> Allocation | None:
        """The claim's allocation: its own, else the one assumed for it."""
        if claim.allocation is not None:
            return claim.allocation
        assumed = self.assumed.get(claim.uid)
        return assumed[1] if assumed else None

    def _recount(self, claim_uid: str) -> None:
        now = self._claim_allocation.get(claim_uid)
        if now is None and claim_uid in self.assumed:
            now = self.assumed[claim_uid][1]
        before = self._held.pop(claim_uid, None)
        if before is not None:
            self._count(claim_uid, before, -1)
        if now is not None:
            self._held[claim_uid] = now
            self._count(claim_uid, now, 1)

    def _count(self, claim_uid: str, allocation: Allocation, sign: int) -> None:
        for result in allocation.results:
            usage = self._usage.get(result.key)
            if usage is None:
                usage = self._usage[result.key] = Usage()
                self._mark_in_use(result.key, 1)
            usage.claims[claim_uid] += sign
            if usage.claims[claim_uid] <= 0:
                del usage.claims[claim_uid]
            for name, amount in result.consumed.items():
                usage.consumed[name] = usage.consumed.get(name, Decimal(0)) + sign * amount
            if not usage.claims:
                del self._usage[result.key]
                self._mark_in_use(result.key, -1)

    def _mark_in_use(self, key: DeviceKey, sign: int) -> None:
        device = self._devices.get(key)
        if device is not None:  # else not counted: its node's rebuild counts it
            self._in_use[device.node] += sign

    def release_claims_of(self, pod_uid: str) -> list[str]:
        """Preemption's simulation: the claims made for this pod (their owner) stop counting,
        as the claim controller deallocates them once the pod is gone; the UIDs released, for
        `restore_claims`. A claim shared with other pods stays."""
        released = []
        for claim in self.claims.values():
            if claim.owner_uid == pod_uid and claim.uid in self._held:
                self._count(claim.uid, self._held.pop(claim.uid), -1)
                released.append(claim.uid)
        return released

    def devices_in_use(self, node: str) -> int:
        """How many of the node's devices some allocation holds."""
        return self._in_use.get(node, 0)

    def rank_by_room(self, nodes: Iterable[str]) -> list[str]:
        """Those of `nodes` with a device free or shareable, fullest first (binpack: the
        search for a pod's claims starts where devices are already in use)."""
        ranked = []
        for node in nodes:
            used = self._in_use.get(node, 0)
            if used < len(self.node_devices.get(node, ())) or node in self._shareable:
                ranked.append((-used, node))
        ranked.sort()
        return [node for _, node in ranked]

    def holds_claims_of(self, pod_uid: str) -> bool:
        """Whether a claim made for this pod still holds devices."""
        return any(c.owner_uid == pod_uid and c.uid in self._held for c in self.claims.values())

    def restore_claims(self, claim_uids: Iterable[str]) -> None:
        """Counts released claims again (the simulation is over)."""
        for uid in claim_uids:
            self._recount(uid)

    def usage(self, key: DeviceKey) -> Usage | None:
        return self._usage.get(key)

    def counters_used(self, node: str) -> dict[CounterKey, dict[str, Decimal]]:
        """What the node's devices in use take of their counter sets."""
        used: dict[CounterKey, dict[str, Decimal]] = {}
        for device in self.node_devices.get(node, ()):
            if device.consumes and device.key in self._usage:
                for set_name, counters in device.consumes:
                    into = used.setdefault((device.driver, device.pool, set_name), {})
                    for name, amount in counters.items():
                        into[name] = into.get(name, Decimal(0)) + amount
        return used

    def holders(self, key: DeviceKey) -> Iterable[str]:
        """UIDs of the claims allocated a device (theirs or assumed)."""
        usage = self._usage.get(key)
        return list(usage.claims) if usage else []

    def overcommitted(self) -> list[str]:
        """Devices held beyond what they offer (an invariant: always empty)."""
        problems = []
        for key, usage in self._usage.items():
            device = self._devices.get(key)
            if device is None:
                continue
            if not device.allow_multiple and len(usage.claims) > 1:
                problems.append(f"device {'/'.join(key)} allocated to {sorted(usage.claims)}")
            for name, used in usage.consumed.items():
                cap = device.capacity.get(name)
                if cap is not None and used > cap.value:
                    problems.append(f"device {'/'.join(key)} capacity {name}: {used} > {cap.value}")
        return problems
