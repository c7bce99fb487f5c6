"""The device inventory a Device Plugin publishes on its Node, and its encoding.

The Device Plugin writes it (node annotation `annotations.node_devices`) from
the Runtime's device list; the Scheduler Framework reads it to place pods on
specific devices (ids, sharing mode, NUMA node, interconnect peers, MIG
instances). A node without the annotation is scheduled from its capacity
alone: `resources.gpu` devices with ids "0".."N-1", TDM mode, no topology.

Encoding: compact JSON, `{"devices": [...]}`; one device is

    {"id": "GPU-3f1c", "index": 0, "kind": "gpu", "mode": "tdm", "numa": 0,
     "healthy": true,
     "links": [{"peer": "GPU-8a2e", "kind": "nvlink", "gbps": 600}],
     "mig": [{"id": "MIG-1", "profile": "1g.10gb"}]}

`kind` is a name of the device-kind table (`lj_runtimekit.proto.pkg.devicekind`:
gpu | ppu | amd), `mode` exclusive | tdm | mig, `numa` -1 when
unknown, `links.kind` nvlink | pcie; `healthy`, `links`, `mig` and `numa` may
be omitted (true, none, none, -1). Unknown fields are rejected so that a typo
never silently drops topology.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, cast

from lj_runtimekit.proto.pkg import devicekind

DeviceModeName = Literal["exclusive", "tdm", "mig"]
LinkKindName = Literal["nvlink", "pcie"]

DEVICE_MODES: tuple[DeviceModeName, ...] = ("exclusive", "tdm", "mig")
LINK_KINDS: tuple[LinkKindName, ...] = ("nvlink", "pcie")


_DEVICE_FIELDS = {"id", "index", "kind", "mode", "numa", "healthy", "links", "mig"}


class InventoryError(ValueError):
    """A malformed node device inventory; the message names the bad part."""


@dataclass(frozen=True)
class DeviceLink:
    """A link from a device to a peer device of the same node."""

    peer: str
    kind: LinkKindName = "pcie"
    bandwidth_gbps: int = 0


@dataclass(frozen=True)
class MigSlot:
    """One MIG instance of a device; given whole to one container."""

    id: str
    profile: str


@dataclass(frozen=True)
class NodeDevice:
    """One accelerator of a node, as the scheduler needs to know it."""

    id: str
    index: int
    kind: str = "gpu"
    """A name of the device-kind table."""
    mode: DeviceModeName = "tdm"
    numa: int = -1
    healthy: bool = True
    links: tuple[DeviceLink, ...] = ()
    mig: tuple[MigSlot, ...] = ()


def encode_inventory(devices: Iterable[NodeDevice]) -> str:
    """Encode a node's devices as compact JSON, ordered by index."""
    out: list[dict[str, object]] = []
    for dev in sorted(devices, key=lambda d: d.index):
        item: dict[str, object] = {
            "id": dev.id,
            "index": dev.index,
            "kind": dev.kind,
            "mode": dev.mode,
        }
        if dev.numa >= 0:
            item["numa"] = dev.numa
        if not dev.healthy:
            item["healthy"] = False
        if dev.links:
            item["links"] = [
                {"peer": link.peer, "kind": link.kind, "gbps": link.bandwidth_gbps}
                for link in dev.links
            ]
        if dev.mig:
            item["mig"] = [{"id": m.id, "profile": m.profile} for m in dev.mig]
        out.append(item)
    return json.dumps({"devices": out}, separators=(",", ":"))


def _fields(item: object, where: str, known: set[str]) -> Mapping[str, object]:
    if not isinstance(item, dict):
        raise InventoryError(f"{where}: must be an object")
    unknown = set(item) - known
    if unknown:
        raise InventoryError(f"{where}: unknown fields {sorted(unknown)}")
    return cast("Mapping[str, object]", item)


def _string(item: Mapping[str, object], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InventoryError(f"{where}.{key}: must be a non-empty string, got {value!r}")
    return value


def _integer(item: Mapping[str, object], key: str, where: str, default: int, low: int) -> int:
    value = item.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InventoryError(f"{where}.{key}: must be an integer >= {low}, got {value!r}")
    return value


def _choice(item: Mapping[str, object], key: str, where: str, allowed: tuple[str, ...]) -> str:
    value = item.get(key)
    if value not in allowed:
        raise InventoryError(f"{where}.{key}: must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _list(item: Mapping[str, object], key: str, where: str) -> list[object]:
    value = item.get(key, [])
    if not isinstance(value, list):
        raise InventoryError(f"{where}.{key}: must be a list")
    return value


def decode_inventory(text: str) -> tuple[NodeDevice, ...]:
    """Decode a node device inventory; raise InventoryError naming the bad part."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"not valid JSON: {exc.msg} at character {exc.pos}") from exc
    top = _fields(data, "inventory", {"devices"})
    devices: list[NodeDevice] = []
    ids: set[str] = set()
    indexes: set[int] = set()
    for i, raw in enumerate(_list(top, "devices", "inventory")):
        where = f"devices[{i}]"
        item = _fields(
            raw, where, {"id", "index", "kind", "mode", "numa", "healthy", "links", "mig"}
        )
        dev_id = _string(item, "id", where)
        index = _integer(item, "index", where, -1, 0)
        if dev_id in ids:
            raise InventoryError(f"{where}.id: duplicate device id {dev_id!r}")
        if index in indexes:
            raise InventoryError(f"{where}.index: duplicate device index {index}")
        ids.add(dev_id)
        indexes.add(index)
        healthy = item.get("healthy", True)
        if not isinstance(healthy, bool):
            raise InventoryError(f"{where}.healthy: must be true or false, got {healthy!r}")
        links: list[DeviceLink] = []
        for j, raw_link in enumerate(_list(item, "links", where)):
            lw = f"{where}.links[{j}]"
            link = _fields(raw_link, lw, {"peer", "kind", "gbps"})
            links.append(
                DeviceLink(
                    peer=_string(link, "peer", lw),
                    kind=cast("LinkKindName", _choice(link, "kind", lw, LINK_KINDS)),
                    bandwidth_gbps=_integer(link, "gbps", lw, 0, 0),
                )
            )
        migs: list[MigSlot] = []
        for j, raw_mig in enumerate(_list(item, "mig", where)):
            mw = f"{where}.mig[{j}]"
            mig = _fields(raw_mig, mw, {"id", "profile"})
            migs.append(MigSlot(id=_string(mig, "id", mw), profile=_string(mig, "profile", mw)))
        mode = cast("DeviceModeName", _choice(item, "mode", where, DEVICE_MODES))
        if migs and mode != "mig":
            raise InventoryError(f"{where}.mig: MIG instances on a device in {mode} mode")
        devices.append(
            NodeDevice(
                id=dev_id,
                index=index,
                kind=_choice(item, "kind", where, devicekind.names()),
                mode=mode,
                numa=_integer(item, "numa", where, -1, -1),
                healthy=healthy,
                links=tuple(links),
                mig=tuple(migs),
            )
        )
    return tuple(sorted(devices, key=lambda d: d.index))
