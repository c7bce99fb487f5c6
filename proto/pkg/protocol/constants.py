"""Loader of `protocol.yaml`: flat dotted keys, built-in defaults (docs/architecture.md, Names).

Changing a resource name is a ConfigMap edit and a restart, never a rebuild.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

DEFAULTS: Mapping[str, str] = MappingProxyType(
    {
        "resources.gpu": "alibabacloud.com/gpu",
        "resources.core": "alibabacloud.com/gpu-core.percentage",
        "resources.memory": "alibabacloud.com/gpu-memory.percentage",
        "resources.ppu": "alibabacloud.com/ppu",
        "resources.amd": "alibabacloud.com/amd-gpu",
        "resources.mig_prefix": "alibabacloud.com",
        "labels.enable": "lj_runtimekit_enable",
        "labels.device_kind": "lingjun.com/device-kind",
        "labels.device_model": "lingjun.com/device-model",
        "labels.device_count": "lingjun.com/device-count",
        "labels.device_mode": "lingjun.com/device-mode",
        "labels.runtime_version": "lingjun.com/runtime-version",
        "labels.topology_block": "lingjun.com/topology-block",
        "labels.topology_switch": "lingjun.com/topology-switch",
        "labels.device_api": "lingjun.com/device-api",
        "annotations.assigned_devices": "lingjun.com/assigned-devices",
        "annotations.assume_time": "lingjun.com/assume-time",
        "annotations.bind_phase": "lingjun.com/bind-phase",
        "annotations.allocated_devices": "lingjun.com/allocated-devices",
        "annotations.gpu_policy": "lingjun.com/gpu-policy",
        "annotations.gang_group": "lingjun.com/gang-group",
        "annotations.gang_min_members": "lingjun.com/gang-min-members",
        "annotations.gang_timeout_seconds": "lingjun.com/gang-timeout-seconds",
        "annotations.gang_topology": "lingjun.com/gang-topology",
        "annotations.node_devices": "lingjun.com/node-devices",
        "annotations.node_admission": "lingjun.com/device-admission",
        "dra.driver": "dra.lingjun.com",
    }
)

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_RE = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_NAME_RE = re.compile(rf"^{_NAME}$")


class ProtocolError(ValueError):
    """A protocol file that cannot be used; the message names the key and the file."""


def _check_prefix(prefix: str) -> str | None:
    if len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix):
        return f"prefix {prefix!r} is not a DNS subdomain (lowercase, dots, at most 253 characters)"
    return None


def _check_qualified_name(value: str, *, prefix_required: bool) -> str | None:
    prefix, slash, name = value.rpartition("/")
    if not slash:
        if prefix_required:
            return f"{value!r} needs a domain prefix, e.g. example.com/{value}"
        name = value
    elif (problem := _check_prefix(prefix)) is not None:
        return problem
    if len(name) > 63 or not _NAME_RE.match(name):
        return (
            f"name {name!r} must be at most 63 characters of alphanumerics, '-', '_' or '.',"
            " starting and ending with an alphanumeric"
        )
    return None


def _check_extended_resource(value: str) -> str | None:
    problem = _check_qualified_name(value, prefix_required=True)
    if problem is not None:
        return f"{value!r} is not a valid extended resource name: {problem}"
    prefix = value.rpartition("/")[0]
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return (
            f"{value!r} is not a valid extended resource name: the kubernetes.io domain is reserved"
        )
    return None


def _check_key(value: str) -> str | None:
    problem = _check_qualified_name(value, prefix_required=False)
    return None if problem is None else f"{value!r} is not a valid label/annotation key: {problem}"


def _checker(key: str) -> Callable[[str], str | None]:
    if key in ("resources.mig_prefix", "dra.driver"):
        return _check_prefix
    if key.startswith("resources."):
        return _check_extended_resource
    return _check_key


@dataclass(frozen=True)
class Resources:
    """Extended resource names."""

    gpu: str
    core: str
    memory: str
    ppu: str
    amd: str
    mig_prefix: str

    def mig(self, profile: str) -> str:
        """Resource name of a MIG profile, e.g. `alibabacloud.com/mig-1g.10gb`."""
        return f"{self.mig_prefix}/mig-{profile}"

    def mig_profile(self, resource: str) -> str | None:
        """The MIG profile of a resource name, or None when it is not a MIG resource."""
        head = f"{self.mig_prefix}/mig-"
        return resource[len(head) :] if resource.startswith(head) else None


@dataclass(frozen=True)
class Labels:
    """Node label keys."""

    enable: str
    device_kind: str
    device_model: str
    device_count: str
    device_mode: str
    runtime_version: str
    topology_block: str
    topology_switch: str
    device_api: str
    """Node label choosing the node's device API: `dra` runs the DRA kubelet plugin
    (DRA_MODE); absent or anything else runs the device plugin."""


@dataclass(frozen=True)
class Annotations:
    """Annotation keys (on pods, and `node_devices` on nodes)."""

    assigned_devices: str
    assume_time: str
    bind_phase: str
    allocated_devices: str
    gpu_policy: str
    gang_group: str
    gang_min_members: str
    gang_timeout_seconds: str
    gang_topology: str
    node_devices: str
    """Node annotation: the device inventory the Device Plugin publishes (inventory.py)."""
    node_admission: str
    """Node annotation: how the node's Device Plugin tells which pod the kubelet admits
    (`ADMISSION_KUBELET_ORDER` or `ADMISSION_SERIAL`; absent means serial)."""


DRA_MODE = "dra"
"""The value of `labels.device_api` that puts a node in DRA mode."""


@dataclass(frozen=True)
class Dra:
    """Dynamic Resource Allocation names (docs/dra.md): the driver, and the DeviceClass
    names derived from it."""

    driver: str
    """The DRA driver name: ResourceSlices' `spec.driver`, the kubelet plugin's name, and the
    suffix of every DeviceClass name."""

    def whole_class(self, kind: str) -> str:
        """DeviceClass of a whole device of a kind, e.g. `gpu.dra.lingjun.com`."""
        return f"{kind}.{self.driver}"

    def share_class(self, kind: str) -> str:
        """DeviceClass of a TDM slice (consumable core and memory) of a kind."""
        return f"{kind}-share.{self.driver}"

    @property
    def mig_class(self) -> str:
        """DeviceClass of MIG instances (the profile is chosen by the claim's selector)."""
        return f"mig.{self.driver}"

    def mig_profile_class(self, profile: str) -> str:
        """DeviceClass of MIG instances of one profile, e.g. `mig-1g.10gb.dra.lingjun.com`
        (it names the profile's extended resource)."""
        return f"mig-{profile}.{self.driver}"


@dataclass(frozen=True)
class Protocol:
    """All protocol constants, grouped as in `protocol.yaml`."""

    resources: Resources
    labels: Labels
    annotations: Annotations
    dra: Dra
    source: str = "<built-in defaults>"

    def as_flat(self) -> dict[str, str]:
        """The flat dotted-key form, as written in `protocol.yaml`."""
        flat: dict[str, str] = {}
        for group in ("resources", "labels", "annotations", "dra"):
            for name, value in vars(getattr(self, group)).items():
                flat[f"{group}.{name}"] = value
        return flat


def _build(values: Mapping[str, str], source: str) -> Protocol:
    def group(prefix: str) -> dict[str, str]:
        return {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(prefix + ".")}

    return Protocol(
        resources=Resources(**group("resources")),
        labels=Labels(**group("labels")),
        annotations=Annotations(**group("annotations")),
        dra=Dra(**group("dra")),
        source=source,
    )


class _DuplicateKeyError(Exception):
    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping key given twice (plain YAML keeps the last)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[object, object]:
    lines: dict[str, int] = {}
    for key_node, _ in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        line = key_node.start_mark.line + 1
        if isinstance(key, str) and key in lines:
            raise _DuplicateKeyError(key, lines[key], line)
        if isinstance(key, str):
            lines[key] = line
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _check_distinct(values: Mapping[str, str], source: str) -> None:
    """Within each group no two keys share a value, and no whole resource is a MIG name."""
    prefix = values["resources.mig_prefix"]
    owners: dict[tuple[str, str], str] = {}
    for key, value in values.items():
        if key == "resources.mig_prefix":
            continue
        if key.startswith("resources.") and value.startswith(f"{prefix}/mig-"):
            raise ProtocolError(
                f"{source}: key {key!r}: {value!r} is a MIG resource name"
                f" (resources.mig_prefix {prefix} + /mig-<profile>); give it another name"
            )
        group = key.split(".", 1)[0]
        other = owners.setdefault((group, value), key)
        if other != key:
            raise ProtocolError(
                f"{source}: keys {other!r} and {key!r} both name {value!r}; each needs its own"
            )


def parse_protocol(data: object, source: str) -> Protocol:
    """Validate already-loaded YAML data of a protocol file named `source` (text read from a
    file or a ConfigMap goes through `parse_protocol_text`, which also refuses duplicate
    keys)."""
    if data is None or data == {}:
        raise ProtocolError(
            f"{source}: the protocol file has no keys; give the keys it changes"
            " (deploy/protocol.yaml lists every one), or no file for the built-in names"
        )
    if not isinstance(data, dict):
        raise ProtocolError(f"{source}: expected a mapping of dotted keys to strings")
    values = dict(DEFAULTS)
    for key, value in data.items():
        if key not in DEFAULTS:
            raise ProtocolError(
                f"{source}: unknown key {key!r}; known keys: {', '.join(sorted(DEFAULTS))}"
            )
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ProtocolError(f"{source}: key {key!r} has an empty value")
        if not isinstance(value, str):
            raise ProtocolError(f"{source}: key {key!r} must be a string, got {value!r}")
        problem = _checker(key)(value)
        if problem is not None:
            raise ProtocolError(f"{source}: key {key!r}: {problem}")
        values[key] = value
    _check_distinct(values, source)
    return _build(values, source)


def parse_protocol_text(text: str, source: str) -> Protocol:
    """The protocol of `protocol.yaml` text (a file's or a ConfigMap's, named `source`): the
    one loader of every component and of lj-deploy."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except _DuplicateKeyError as exc:
        raise ProtocolError(
            f"{source}: key {exc.key!r} is given twice (lines {exc.first} and {exc.second});"
            " keep one"
        ) from None
    except yaml.YAMLError as exc:
        raise ProtocolError(f"{source}: not valid YAML: {exc}") from exc
    return parse_protocol(data, source)


def load_protocol(path: str | Path | None = None) -> Protocol:
    """Built-in defaults, overridden by the `protocol.yaml` file at `path` when given."""
    if path is None:
        return _build(DEFAULTS, "<built-in defaults>")
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProtocolError(f"{source}: cannot read protocol file: {exc.strerror}") from exc
    return parse_protocol_text(text, source)
