"""Node description: a YAML file -> validated, typed, frozen dataclasses.

Every operator mistake raises :class:`NodeFileError`, whose message names the
file and the field path (``nodes/bad.yaml: devices[2].mode: must be one of
exclusive, tdm, mig``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import yaml

from lj_runtimekit.proto.pkg.version import InvalidVersionError, parse_version

Kind = Literal["gpu", "ppu", "amd"]
Mode = Literal["exclusive", "tdm", "mig"]
LinkKind = Literal["pcie", "nvlink"]
Topology = Literal["all-to-all", "pairs"]


@dataclass(frozen=True)
class KindFacts:
    """What the simulated Runtime reports and injects for one device kind (its contract
    enum value and feature gate are the device-kind table's, proto/pkg/devicekind)."""

    id_prefix: str
    """Device IDs are `<prefix>-<uuid>`."""
    cdi_kind: str
    idle_watts: float
    max_watts: float


KIND_FACTS: dict[Kind, KindFacts] = {
    "gpu": KindFacts("GPU", "lingjun.com/gpu", 60.0, 400.0),
    "ppu": KindFacts("PPU", "lingjun.com/ppu", 50.0, 350.0),
    "amd": KindFacts("AMD", "lingjun.com/amd", 45.0, 300.0),
}
"""One row per kind the simulator serves (its device paths are in injection.py)."""
KINDS: tuple[Kind, ...] = tuple(KIND_FACTS)
MODES: tuple[Mode, ...] = ("exclusive", "tdm", "mig")
TOPOLOGIES: tuple[Topology, ...] = ("all-to-all", "pairs")

MAX_DEVICES = 256
MIG_COMPUTE_SLICES = 7
MIG_MAX_INSTANCES = 7
_MIG_COMPUTE_SIZES = (1, 2, 3, 4, 7)
_MIG_PROFILE = re.compile(r"^([0-9])g\.([0-9]+)gb$")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {
    None: 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_GIB = 2**30
_NVLINK_LINKS = 12
_NVLINK_BANDWIDTH_GBPS = 600


class NodeFileError(Exception):
    """A node description is invalid; the message names the file and field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + problem)
        self.source = source
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class MigProfile:
    """One MIG instance profile, e.g. ``1g.10gb``."""

    name: str
    compute_slices: int
    memory_bytes: int


@dataclass(frozen=True)
class Interconnect:
    """How the devices of one group are linked to each other."""

    kind: LinkKind
    topology: Topology
    links: int
    bandwidth_gbps: int


@dataclass(frozen=True)
class DeviceSpec:
    """One device of the node, after group expansion and overrides."""

    index: int
    group: int
    kind: Kind
    model: str
    memory_bytes: int
    numa_node: int
    interconnect: Interconnect
    mode: Mode
    mig_layout: tuple[MigProfile, ...]
    healthy: bool
    health_reason: str


@dataclass(frozen=True)
class NodeSpec:
    """A whole node description."""

    name: str
    runtime_version: str
    seed: int
    devices: tuple[DeviceSpec, ...]


def parse_mig_profile(name: str) -> MigProfile:
    """Parse a MIG profile name like ``3g.40gb``; raise ValueError when malformed."""
    match = _MIG_PROFILE.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a MIG profile like 1g.10gb")
    compute, memory_gb = int(match.group(1)), int(match.group(2))
    if compute not in _MIG_COMPUTE_SIZES:
        sizes = ", ".join(str(s) for s in _MIG_COMPUTE_SIZES)
        raise ValueError(f"{name!r} has {compute} compute slices, must be one of {sizes}")
    if memory_gb == 0:
        raise ValueError(f"{name!r} has no memory")
    return MigProfile(name=name, compute_slices=compute, memory_bytes=memory_gb * _GIB)


def load_node_file(path: Path) -> NodeSpec:
    """Read and validate a node description file."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NodeFileError(source, "", f"cannot read: {exc.strerror or exc}") from exc
    return parse_node(text, source)


def parse_node(text: str, source: str) -> NodeSpec:
    """Validate a node description given as YAML text; ``source`` names it in errors."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise NodeFileError(source, "", f"{where}not valid YAML") from exc
    return _Parser(source).node(raw)


class _Parser:
    """Walks the raw YAML, building dataclasses and naming bad fields."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> NodeFileError:
        return NodeFileError(self.source, field, problem)

    def mapping(self, value: object, field: str, allowed: Sequence[str]) -> Mapping[str, object]:
        if not isinstance(value, Mapping):
            raise self.fail(field, "must be a mapping")
        for key in value:
            if key not in allowed:
                name = f"{field}.{key}" if field else str(key)
                raise self.fail(name, "unknown field (known: " + ", ".join(allowed) + ")")
        return cast(Mapping[str, object], value)

    def string(self, value: object, field: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(field, "must be a non-empty string")
        return value.strip()

    def integer(self, value: object, field: str, minimum: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(field, "must be an integer")
        if value < minimum:
            raise self.fail(field, f"must be at least {minimum}")
        return value

    def choice(self, value: object, field: str, options: Sequence[str]) -> str:
        if value not in options:
            raise self.fail(field, "must be one of " + ", ".join(options))
        return cast(str, value)

    def health(self, value: object, field: str) -> bool:
        return self.choice(value, field, ("healthy", "unhealthy")) == "healthy"

    def node(self, raw: object) -> NodeSpec:
        top = self.mapping(raw, "", ("name", "runtimeVersion", "seed", "devices", "overrides"))
        for required in ("name", "runtimeVersion", "devices"):
            if required not in top:
                raise self.fail(required, "required")
        name = self.string(top["name"], "name")
        if len(name) > 253 or not _NODE_NAME.match(name):
            raise self.fail("name", "must be a lowercase RFC 1123 name (a Kubernetes node name)")
        version_text = self.string(top["runtimeVersion"], "runtimeVersion")
        try:
            version = str(parse_version(version_text))
        except InvalidVersionError as exc:
            raise self.fail("runtimeVersion", str(exc).removeprefix("version: ")) from None
        seed = self.integer(top.get("seed", 0), "seed", 0)
        groups = top["devices"]
        if not isinstance(groups, list) or not groups:
            raise self.fail("devices", "must be a non-empty list of device groups")
        devices: list[DeviceSpec] = []
        for number, group in enumerate(groups):
            devices.extend(self.group(group, f"devices[{number}]", number, len(devices)))
        overrides = top.get("overrides", [])
        if not isinstance(overrides, list):
            raise self.fail("overrides", "must be a list")
        seen: set[int] = set()
        for number, override in enumerate(overrides):
            field = f"overrides[{number}]"
            index, device = self.override(override, field, devices)
            if index in seen:
                raise self.fail(f"{field}.index", f"device {index} is overridden twice")
            seen.add(index)
            devices[index] = device
        return NodeSpec(name, version, seed, tuple(devices))

    def group(self, raw: object, field: str, number: int, first: int) -> list[DeviceSpec]:
        group = self.mapping(
            raw,
            field,
            (
                "kind",
                "model",
                "memory",
                "count",
                "numa",
                "interconnect",
                "mode",
                "migLayout",
                "health",
                "healthReason",
            ),
        )
        for required in ("kind", "model", "memory"):
            if required not in group:
                raise self.fail(f"{field}.{required}", "required")
        kind = cast(Kind, self.choice(group["kind"], f"{field}.kind", KINDS))
        model = self.string(group["model"], f"{field}.model")
        memory = self.quantity(group["memory"], f"{field}.memory")
        count = self.integer(group.get("count", 1), f"{field}.count", 1)
        if first + count > MAX_DEVICES:
            raise self.fail(
                f"{field}.count", f"the node would have more than {MAX_DEVICES} devices"
            )
        numa = self.numa(group.get("numa"), f"{field}.numa", count)
        link = self.interconnect(group.get("interconnect", "pcie"), f"{field}.interconnect")
        if link.topology == "pairs" and count % 2:
            raise self.fail(f"{field}.interconnect.topology", "pairs needs an even device count")
        mode = cast(Mode, self.choice(group.get("mode", "exclusive"), f"{field}.mode", MODES))
        layout = self.mig(group, field, mode, kind, memory)
        healthy = self.health(group.get("health", "healthy"), f"{field}.health")
        reason = self.reason(group.get("healthReason", ""), f"{field}.healthReason", healthy)
        return [
            DeviceSpec(
                index=first + offset,
                group=number,
                kind=kind,
                model=model,
                memory_bytes=memory,
                numa_node=numa[offset],
                interconnect=link,
                mode=mode,
                mig_layout=layout,
                healthy=healthy,
                health_reason=reason,
            )
            for offset in range(count)
        ]

    def override(
        self, raw: object, field: str, devices: Sequence[DeviceSpec]
    ) -> tuple[int, DeviceSpec]:
        entry = self.mapping(raw, field, ("index", "mode", "migLayout", "health", "healthReason"))
        if "index" not in entry:
            raise self.fail(f"{field}.index", "required")
        index = self.integer(entry["index"], f"{field}.index", 0)
        if index >= len(devices):
            raise self.fail(f"{field}.index", f"no device {index}; the node has {len(devices)}")
        base = devices[index]
        mode = cast(Mode, self.choice(entry.get("mode", base.mode), f"{field}.mode", MODES))
        if "migLayout" in entry or mode != base.mode:
            layout = self.mig(entry, field, mode, base.kind, base.memory_bytes)
        else:
            layout = base.mig_layout
        healthy = base.healthy
        if "health" in entry:
            healthy = self.health(entry["health"], f"{field}.health")
        reason = self.reason(entry.get("healthReason", ""), f"{field}.healthReason", healthy)
        device = DeviceSpec(
            index=index,
            group=base.group,
            kind=base.kind,
            model=base.model,
            memory_bytes=base.memory_bytes,
            numa_node=base.numa_node,
            interconnect=base.interconnect,
            mode=mode,
            mig_layout=layout,
            healthy=healthy,
            health_reason=reason or (base.health_reason if not healthy else ""),
        )
        return index, device

    def reason(self, value: object, field: str, healthy: bool) -> str:
        if not isinstance(value, str):
            raise self.fail(field, "must be a string")
        if value and healthy:
            raise self.fail(field, "only allowed when health is unhealthy")
        return value

    def quantity(self, value: object, field: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and (match := _QUANTITY.match(value.strip())):
            number = int(match.group(1)) * _UNITS[match.group(2)]
        else:
            raise self.fail(field, "must be a byte count or a quantity like 80Gi")
        if number <= 0:
            raise self.fail(field, "must be more than 0 bytes")
        return number

    def numa(self, value: object, field: str, count: int) -> list[int]:
        if value is None:
            return [-1] * count
        if isinstance(value, int) and not isinstance(value, bool):
            nodes = self.integer(value, field, 1)
            return [offset * nodes // count for offset in range(count)]
        if isinstance(value, list):
            if len(value) != count:
                raise self.fail(field, f"lists {len(value)} NUMA nodes for {count} devices")
            return [self.integer(v, f"{field}[{i}]", 0) for i, v in enumerate(value)]
        raise self.fail(field, "must be a NUMA node count or a list of one NUMA node per device")

    def interconnect(self, value: object, field: str) -> Interconnect:
        if value == "pcie":
            return Interconnect("pcie", "all-to-all", 0, 0)
        if value == "nvlink":
            return Interconnect("nvlink", "all-to-all", _NVLINK_LINKS, _NVLINK_BANDWIDTH_GBPS)
        if isinstance(value, str):
            raise self.fail(field, "must be pcie, nvlink or a mapping")
        link = self.mapping(value, field, ("kind", "topology", "links", "bandwidthGBps"))
        kind = cast(LinkKind, self.choice(link.get("kind"), f"{field}.kind", ("pcie", "nvlink")))
        if kind == "pcie":
            if len(link) > 1:
                raise self.fail(field, "pcie takes no topology, links or bandwidthGBps")
            return Interconnect("pcie", "all-to-all", 0, 0)
        topology = cast(
            Topology,
            self.choice(link.get("topology", "all-to-all"), f"{field}.topology", TOPOLOGIES),
        )
        links = self.integer(link.get("links", _NVLINK_LINKS), f"{field}.links", 1)
        bandwidth = self.integer(
            link.get("bandwidthGBps", _NVLINK_BANDWIDTH_GBPS), f"{field}.bandwidthGBps", 1
        )
        return Interconnect(kind, topology, links, bandwidth)

    def mig(
        self, entry: Mapping[str, object], field: str, mode: Mode, kind: Kind, memory: int
    ) -> tuple[MigProfile, ...]:
        layout_field = f"{field}.migLayout"
        raw = entry.get("migLayout")
        if mode != "mig":
            if raw is not None:
                raise self.fail(layout_field, "only allowed when mode is mig")
            return ()
        if kind != "gpu":
            raise self.fail(f"{field}.mode", f"mig is only supported for kind gpu, not {kind}")
        if raw is None:
            raise self.fail(layout_field, "required when mode is mig")
        if not isinstance(raw, list) or not raw:
            raise self.fail(layout_field, "must be a non-empty list of MIG profiles like 1g.10gb")
        if len(raw) > MIG_MAX_INSTANCES:
            raise self.fail(layout_field, f"has {len(raw)} instances, at most {MIG_MAX_INSTANCES}")
        profiles: list[MigProfile] = []
        for number, item in enumerate(raw):
            name = self.string(item, f"{layout_field}[{number}]")
            try:
                profiles.append(parse_mig_profile(name))
            except ValueError as exc:
                raise self.fail(f"{layout_field}[{number}]", str(exc)) from None
        slices = sum(p.compute_slices for p in profiles)
        if slices > MIG_COMPUTE_SLICES:
            raise self.fail(
                layout_field, f"uses {slices} compute slices, a GPU has {MIG_COMPUTE_SLICES}"
            )
        used = sum(p.memory_bytes for p in profiles)
        if used > memory:
            raise self.fail(
                layout_field,
                f"uses {used // _GIB} GiB, more than the device's {memory // _GIB} GiB",
            )
        return tuple(profiles)
