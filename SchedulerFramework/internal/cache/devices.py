"""Per-node device accounting: which pod holds which device, slice or MIG instance.

Built from the node's inventory annotation (or its capacity when absent) and
fed with the device assignments of the pods on the node. It never refuses to
record an assignment (a rebuilt state must show reality, even an overcommitted
one); it only answers what is still free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lj_runtimekit.proto.pkg.protocol import DeviceShare, NodeDevice

# Score of one link between two devices, used to rank device sets.
LINK_SCORE: Mapping[str, int] = {"nvlink": 100, "pcie": 10}
SAME_NUMA_SCORE = 5
"""Two devices without a reported link but on one NUMA node (PCIe under one root)."""


@dataclass
class DeviceState:
    """One device of a node and who holds it."""

    id: str
    index: int
    kind: str
    mode: str
    numa: int
    healthy: bool
    links: dict[str, int]
    """peer device id -> link score"""
    mig_profiles: dict[str, str]
    """MIG instance id -> profile"""
    whole: set[str] = field(default_factory=set)
    """owners holding the whole device"""
    slices: dict[str, tuple[int, int]] = field(default_factory=dict)
    """owner -> (core %, memory %)"""
    mig_used: dict[str, str] = field(default_factory=dict)
    """MIG instance id -> owner"""
    core_used: int = 0
    memory_used: int = 0

    @property
    def wholly_free(self) -> bool:
        """Can be given whole: healthy, not in MIG mode, nobody on it."""
        return (
            self.healthy
            and self.mode != "mig"
            and not self.whole
            and not self.slices
            and not self.mig_used
        )

    @property
    def sliceable(self) -> bool:
        """Can carry (more) TDM slices: healthy, TDM mode, not given whole."""
        return self.healthy and self.mode == "tdm" and not self.whole and not self.mig_used

    @property
    def core_free(self) -> int:
        return 100 - self.core_used

    @property
    def memory_free(self) -> int:
        return 100 - self.memory_used


def devices_from_inventory(inventory: Iterable[NodeDevice]) -> list[DeviceState]:
    devices = [
        DeviceState(
            id=d.id,
            index=d.index,
            kind=d.kind,
            mode=d.mode,
            numa=d.numa,
            healthy=d.healthy,
            links={},
            mig_profiles={m.id: m.profile for m in d.mig},
        )
        for d in inventory
    ]
    by_id = {d.id: d for d in devices}
    for src in inventory:
        for link in src.links:
            if link.peer in by_id and link.peer != src.id:
                score = LINK_SCORE.get(link.kind, 0)
                a, b = by_id[src.id], by_id[link.peer]
                a.links[b.id] = max(a.links.get(b.id, 0), score)
                b.links[a.id] = max(b.links.get(a.id, 0), score)
    return devices


def devices_from_capacity(count: int, kind: str = "gpu") -> list[DeviceState]:
    """The fallback when a node publishes no inventory: ids "0".."N-1", TDM, no topology."""
    return [DeviceState(str(i), i, kind, "tdm", -1, True, {}, {}) for i in range(max(0, count))]


class NodeDevices:
    """The devices of one node and their holders."""

    __slots__ = (
        "_capacity",
        "_mig_parent",
        "by_id",
        "devices",
        "from_inventory",
        "holdings",
        "version",
    )

    def __init__(self, devices: list[DeviceState], from_inventory: bool) -> None:
        self.devices = sorted(devices, key=lambda d: d.index)
        self.by_id = {d.id: d for d in self.devices}
        self._mig_parent = {mig: d for d in self.devices for mig in d.mig_profiles}
        self._capacity: dict[str, int] = {}
        """kind -> devices that can be given whole (health and mode are fixed per table)"""
        for d in self.devices:
            if d.healthy and d.mode != "mig":
                self._capacity[d.kind] = self._capacity.get(d.kind, 0) + 1
        self.from_inventory = from_inventory
        self.holdings: dict[str, tuple[DeviceShare, ...]] = {}
        """owner (pod uid) -> every share it holds on this node"""
        self.version = 0
        """bumped on every change; memo keys of derived data"""

    # -- accounting -----------------------------------------------------------------------

    def apply(self, owner: str, shares: Iterable[DeviceShare]) -> None:
        """Record that `owner` holds `shares` (added to what it already holds)."""
        shares = tuple(shares)
        if not shares:
            return
        self.holdings[owner] = self.holdings.get(owner, ()) + shares
        for share in shares:
            self._apply_one(owner, share, +1)
        self.version += 1

    def release(self, owner: str) -> tuple[DeviceShare, ...]:
        """Forget everything `owner` holds; returns what it held."""
        shares = self.holdings.pop(owner, ())
        for share in shares:
            self._apply_one(owner, share, -1)
        if shares:
            self.version += 1
        return shares

    def _apply_one(self, owner: str, share: DeviceShare, sign: int) -> None:
        parent = self._mig_parent.get(share.device_id)
        if parent is not None:
            if sign > 0:
                parent.mig_used[share.device_id] = owner
            elif parent.mig_used.get(share.device_id) == owner:
                del parent.mig_used[share.device_id]
            return
        dev = self.by_id.get(share.device_id)
        if dev is None:
            return  # a device the node no longer reports; kept in holdings only
        if share.whole:
            if sign > 0:
                dev.whole.add(owner)
            else:
                dev.whole.discard(owner)
            return
        core, mem = dev.slices.get(owner, (0, 0))
        core += sign * share.core_percent
        mem += sign * share.memory_percent
        dev.core_used += sign * share.core_percent
        dev.memory_used += sign * share.memory_percent
        if core <= 0 and mem <= 0:
            dev.slices.pop(owner, None)
        else:
            dev.slices[owner] = (core, mem)

    def replace_devices(self, devices: list[DeviceState], from_inventory: bool) -> None:
        """New inventory: rebuild the device table and re-apply every holding.

        A MIG instance still held after its GPU left MIG mode stays on that GPU (it is in
        use until its pod goes), so the GPU is given neither whole nor sliced meanwhile."""
        holdings = self.holdings
        held_mig = {
            s.device_id: parent.id
            for shares in holdings.values()
            for s in shares
            if (parent := self._mig_parent.get(s.device_id)) is not None
        }
        self.__init__(devices, from_inventory)  # type: ignore[misc]
        for mig, parent_id in held_mig.items():
            if mig not in self._mig_parent and parent_id in self.by_id:
                self._mig_parent[mig] = self.by_id[parent_id]
        for owner, shares in holdings.items():
            self.apply(owner, shares)

    # -- queries --------------------------------------------------------------------------

    def free_whole(self, kind: str) -> list[DeviceState]:
        return [d for d in self.devices if d.kind == kind and d.wholly_free]

    def free_whole_count(self, kind: str) -> int:
        return sum(1 for d in self.devices if d.kind == kind and d.wholly_free)

    def whole_capacity(self, kind: str) -> int:
        return self._capacity.get(kind, 0)

    def free_mig(self, profile: str) -> list[str]:
        return [
            mig
            for d in self.devices
            if d.healthy and d.mode == "mig" and not d.whole and not d.slices
            for mig, prof in d.mig_profiles.items()
            if prof == profile and mig not in d.mig_used
        ]

    def mig_capacity(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.devices:
            if d.healthy and d.mode == "mig":
                for prof in d.mig_profiles.values():
                    out[prof] = out.get(prof, 0) + 1
        return out

    def used_units(self) -> tuple[int, int]:
        """(used, total) in percent units over whole-able devices, for binpack/spread scores."""
        used = total = 0
        for d in self.devices:
            if not d.healthy:
                continue
            if d.mode == "mig":
                total += 100 * len(d.mig_profiles)
                used += 100 * len(d.mig_used)
                continue
            total += 100
            if d.whole:
                used += 100
            else:
                used += max(d.core_used, d.memory_used)
        return used, total

    def violations(self) -> list[str]:
        """Breaches of the sharing invariant (docs/architecture.md, Sharing) on this node."""
        out: list[str] = []
        for d in self.devices:
            if d.core_used > 100:
                out.append(f"device {d.id}: core slices sum to {d.core_used}%")
            if d.memory_used > 100:
                out.append(f"device {d.id}: memory slices sum to {d.memory_used}%")
            if d.whole and d.slices:
                out.append(f"device {d.id}: given whole and carries slices")
            if len(d.whole) > 1:
                out.append(f"device {d.id}: given whole to {len(d.whole)} pods")
            if d.mode == "mig" and (d.whole or d.slices):
                out.append(f"device {d.id}: in MIG mode but given whole or sliced")
            if d.mig_used and (d.whole or d.slices):
                out.append(f"device {d.id}: MIG instances and TDM use at once")
        seen: dict[str, str] = {}
        for owner, shares in self.holdings.items():
            for s in shares:
                if s.device_id in self._mig_parent:
                    if s.device_id in seen and seen[s.device_id] != owner:
                        out.append(f"MIG instance {s.device_id}: given to two pods")
                    seen[s.device_id] = owner
        return out
