"""Device inventory: stable IDs, PCI addresses and interconnect peers for a node."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from lj_runtimekit.runtimesim.node import (
    KIND_FACTS,
    DeviceSpec,
    Kind,
    LinkKind,
    MigProfile,
    Mode,
    NodeSpec,
)

_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "runtime-sim.lingjun.com")
PCIE_BANDWIDTH_GBPS = 32


@dataclass(frozen=True)
class Peer:
    """A link from a device to another device of the node."""

    peer_id: str
    kind: LinkKind
    links: int
    bandwidth_gbps: int


@dataclass(frozen=True)
class MigInstanceInfo:
    """One MIG instance of a device."""

    id: str
    profile: MigProfile
    instance_id: int
    parent_id: str


@dataclass(frozen=True)
class DeviceInfo:
    """The static description of one device (health lives in the state)."""

    id: str
    index: int
    kind: Kind
    model: str
    memory_bytes: int
    numa_node: int
    peers: tuple[Peer, ...]
    mode: Mode
    mig_instances: tuple[MigInstanceInfo, ...]
    pci_bus_id: str


def device_id(node_name: str, kind: Kind, index: int) -> str:
    """Stable device ID, e.g. ``GPU-<uuid>``, derived from the node name and index."""
    return f"{KIND_FACTS[kind].id_prefix}-{uuid.uuid5(_ID_NAMESPACE, f'{node_name}/{index}')}"


def mig_instance_id(node_name: str, index: int, position: int) -> str:
    """Stable MIG instance ID, ``MIG-<uuid>``, from the node, device index and position."""
    return f"MIG-{uuid.uuid5(_ID_NAMESPACE, f'{node_name}/{index}/mig/{position}')}"


def build_inventory(node: NodeSpec) -> tuple[DeviceInfo, ...]:
    """Expand a node description into its devices, ordered by index."""
    ids = [device_id(node.name, d.kind, d.index) for d in node.devices]
    first: dict[int, int] = {}
    for d in node.devices:
        first.setdefault(d.group, d.index)
    devices: list[DeviceInfo] = []
    for spec in node.devices:
        own = ids[spec.index]
        peers = tuple(
            _peer(spec, other, ids[other.index], first[spec.group])
            for other in node.devices
            if other.index != spec.index
        )
        instances = tuple(
            MigInstanceInfo(
                id=mig_instance_id(node.name, spec.index, position),
                profile=profile,
                instance_id=position + 1,
                parent_id=own,
            )
            for position, profile in enumerate(spec.mig_layout)
        )
        devices.append(
            DeviceInfo(
                id=own,
                index=spec.index,
                kind=spec.kind,
                model=spec.model,
                memory_bytes=spec.memory_bytes,
                numa_node=spec.numa_node,
                peers=peers,
                mode=spec.mode,
                mig_instances=instances,
                pci_bus_id=f"0000:{0x10 + 8 * spec.index:02x}:00.0",
            )
        )
    return tuple(devices)


def _peer(spec: DeviceSpec, other: DeviceSpec, other_id: str, group_first: int) -> Peer:
    link = spec.interconnect
    same_pair = (spec.index - group_first) // 2 == (other.index - group_first) // 2
    linked = (
        other.group == spec.group
        and link.kind == "nvlink"
        and (link.topology == "all-to-all" or same_pair)
    )
    if linked:
        return Peer(other_id, "nvlink", link.links, link.bandwidth_gbps)
    return Peer(other_id, "pcie", 0, PCIE_BANDWIDTH_GBPS)
