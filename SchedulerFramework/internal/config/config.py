"""LjSchedulerConfiguration: the YAML config, in the spirit of KubeSchedulerConfiguration.

    apiVersion: scheduler.lingjun.com/v1
    kind: LjSchedulerConfiguration
    clientConnection: {qps: 50, burst: 100}
    leaderElection: {leaderElect: true, resourceName: lj-scheduler,   # default: the profiles'
                     resourceNamespace: kube-system, leaseDuration: 15s,  # names
                     renewDeadline: 10s, retryPeriod: 2s}
    nodeOwnerLabel: lingjun.com/scheduler-name   # a node labelled with it is placed on only
    requireNodeOwner: false                      # by that profile; true: unlabelled nodes by none
    percentageOfNodesToScore: 0          # 0: adaptive, as upstream
    podInitialBackoffSeconds: 1
    podMaxBackoffSeconds: 10
    bindWorkers: 192
    profiles:
      - schedulerName: lj-scheduler
        plugins:
          multiPoint:
            enabled: [{name: GpuShare, weight: 3}]
            disabled: [{name: DeviceTopology}]     # or {name: "*"}
        pluginConfig:
          - name: GpuShare
            args: {policy: spread}

Every mistake raises ConfigError naming the file and the field.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.schedulerframework.internal.framework.args import ArgsError
from lj_runtimekit.schedulerframework.internal.plugins.dynamicresources import (
    NAME as DYNAMIC_RESOURCES,
)
from lj_runtimekit.schedulerframework.internal.plugins.registry import DEFAULT_PLUGINS, REGISTRY

API_VERSION = "scheduler.lingjun.com/v1"
KIND = "LjSchedulerConfiguration"
DEFAULT_SCHEDULER_NAME = "lj-scheduler"
DEFAULT_NODE_OWNER_LABEL = "lingjun.com/scheduler-name"
_LEASE_NAME_MAX = 253


class ConfigError(ValueError):
    """An unusable configuration; the message names the file and the field."""


@dataclass(frozen=True)
class PluginSetting:
    name: str
    weight: int
    args: object


@dataclass(frozen=True)
class Profile:
    scheduler_name: str
    plugins: tuple[PluginSetting, ...]


@dataclass(frozen=True)
class LeaderElection:
    leader_elect: bool = True
    resource_name: str = "lj-scheduler"
    resource_namespace: str = "kube-system"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


@dataclass(frozen=True)
class Config:
    profiles: tuple[Profile, ...]
    qps: float = 50.0
    burst: int = 100
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    percentage_of_nodes_to_score: int = 0
    pod_initial_backoff_s: float = 1.0
    pod_max_backoff_s: float = 10.0
    bind_workers: int = 192
    node_owner_label: str = DEFAULT_NODE_OWNER_LABEL
    """A node carrying this label is placed on only by the profile its value names."""
    require_node_owner: bool = False
    """True: a node without the owner label is placed on by no profile of this process."""
    source: str = "<defaults>"

    def profile(self, scheduler_name: str) -> Profile | None:
        return next((p for p in self.profiles if p.scheduler_name == scheduler_name), None)


def lease_name(scheduler_names: Sequence[str]) -> str:
    """The default Lease name: the profiles' scheduler names, sorted and joined by dots (a
    hash when that is too long), so processes running other profiles each lead."""
    name = ".".join(sorted(scheduler_names))
    if len(name) <= _LEASE_NAME_MAX:
        return name
    return f"lj-scheduler-{hashlib.sha256(name.encode()).hexdigest()[:16]}"


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: {where}: {problem}")

    def mapping(self, data: object, where: str, known: tuple[str, ...]) -> Mapping[str, Any]:
        if data is None:
            return {}
        if not isinstance(data, Mapping):
            raise self.fail(where, f"must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise self.fail(where, f"unknown fields {unknown}; known: {', '.join(known)}")
        return data

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        where: str,
        default: float,
        low: float,
        integer: bool = False,
    ) -> float:
        value = data.get(key, default)
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok or value < low:
            kind = "an integer" if integer else "a number"
            raise self.fail(f"{where}.{key}", f"must be {kind} >= {low}, got {value!r}")
        return float(value)

    def duration(self, data: Mapping[str, Any], key: str, where: str, default: float) -> float:
        value = data.get(key, default)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        m = _DURATION.match(str(value))
        if not m or float(m.group(1)) <= 0:
            raise self.fail(
                f"{where}.{key}", f"must be a positive duration like 15s, got {value!r}"
            )
        return float(m.group(1)) * _UNIT[m.group(2)]

    def string(self, data: Mapping[str, Any], key: str, where: str, default: str) -> str:
        value = data.get(key, default)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where}.{key}", f"must be a non-empty string, got {value!r}")
        return value


def _profile(r: _Reader, raw: object, where: str) -> Profile:
    data = r.mapping(raw, where, ("schedulerName", "plugins", "pluginConfig"))
    name = r.string(data, "schedulerName", where, DEFAULT_SCHEDULER_NAME)
    plugins = r.mapping(data.get("plugins"), f"{where}.plugins", ("multiPoint",))
    multi = r.mapping(
        plugins.get("multiPoint"), f"{where}.plugins.multiPoint", ("enabled", "disabled")
    )
    order: dict[str, int] = dict(DEFAULT_PLUGINS)
    for i, item in enumerate(multi.get("disabled") or ()):
        w = f"{where}.plugins.multiPoint.disabled[{i}]"
        entry = r.mapping(item, w, ("name",))
        pname = r.string(entry, "name", w, "")
        if pname == "*":
            order.clear()
        elif pname not in REGISTRY:
            raise r.fail(f"{w}.name", f"unknown plugin {pname!r}; known: {', '.join(REGISTRY)}")
        else:
            order.pop(pname, None)
    for i, item in enumerate(multi.get("enabled") or ()):
        w = f"{where}.plugins.multiPoint.enabled[{i}]"
        entry = r.mapping(item, w, ("name", "weight"))
        pname = r.string(entry, "name", w, "")
        if pname not in REGISTRY:
            raise r.fail(f"{w}.name", f"unknown plugin {pname!r}; known: {', '.join(REGISTRY)}")
        default_weight = dict(DEFAULT_PLUGINS).get(pname, 1)
        order[pname] = int(r.number(entry, "weight", w, default_weight, 0, integer=True))
    raw_args: dict[str, Mapping[str, Any]] = {}
    for i, item in enumerate(data.get("pluginConfig") or ()):
        w = f"{where}.pluginConfig[{i}]"
        entry = r.mapping(item, w, ("name", "args"))
        pname = r.string(entry, "name", w, "")
        if pname not in REGISTRY:
            raise r.fail(f"{w}.name", f"unknown plugin {pname!r}; known: {', '.join(REGISTRY)}")
        args = entry.get("args") or {}
        if not isinstance(args, Mapping):
            raise r.fail(f"{w}.args", "must be a mapping")
        raw_args[pname] = args
    settings: list[PluginSetting] = []
    for pname, weight in order.items():
        try:
            args = REGISTRY[pname].parse_args(raw_args.get(pname, {}))
        except ArgsError as exc:
            raise ConfigError(f"{r.source}: {where}: {exc}") from None
        settings.append(PluginSetting(pname, weight, args))
    if not any(s.name == "DefaultBinder" for s in settings):
        raise r.fail(f"{where}.plugins", "no bind plugin enabled (enable DefaultBinder)")
    if not any(s.name == DYNAMIC_RESOURCES for s in settings):
        raise r.fail(
            f"{where}.plugins",
            f"{DYNAMIC_RESOURCES} disabled: pods with ResourceClaims would be bound with their "
            f"claims unallocated (enable {DYNAMIC_RESOURCES})",
        )
    return Profile(name, tuple(settings))


def parse_config(data: object, source: str, scheduler_name: str | None = None) -> Config:
    """Validate loaded YAML; `scheduler_name` (the flag) renames a single profile."""
    r = _Reader(source)
    top = r.mapping(
        data,
        "config",
        (
            "apiVersion",
            "kind",
            "clientConnection",
            "leaderElection",
            "percentageOfNodesToScore",
            "podInitialBackoffSeconds",
            "podMaxBackoffSeconds",
            "bindWorkers",
            "nodeOwnerLabel",
            "requireNodeOwner",
            "profiles",
        ),
    )
    if top.get("apiVersion", API_VERSION) != API_VERSION:
        raise r.fail("apiVersion", f"must be {API_VERSION}, got {top.get('apiVersion')!r}")
    if top.get("kind", KIND) != KIND:
        raise r.fail("kind", f"must be {KIND}, got {top.get('kind')!r}")
    client = r.mapping(top.get("clientConnection"), "clientConnection", ("qps", "burst"))
    le_raw = r.mapping(
        top.get("leaderElection"),
        "leaderElection",
        (
            "leaderElect",
            "resourceName",
            "resourceNamespace",
            "leaseDuration",
            "renewDeadline",
            "retryPeriod",
        ),
    )
    leader_elect = le_raw.get("leaderElect", True)
    if not isinstance(leader_elect, bool):
        raise r.fail("leaderElection.leaderElect", f"must be true or false, got {leader_elect!r}")
    raw_profiles = top.get("profiles") or [{}]
    if not isinstance(raw_profiles, list):
        raise r.fail("profiles", "must be a list")
    profiles = [_profile(r, p, f"profiles[{i}]") for i, p in enumerate(raw_profiles)]
    if scheduler_name is not None:
        if len(profiles) != 1:
            raise ConfigError(
                f"{source}: --scheduler-name renames the profile, but the config has "
                f"{len(profiles)} profiles; set schedulerName in each profile instead"
            )
        profiles = [Profile(scheduler_name, profiles[0].plugins)]
    names = [p.scheduler_name for p in profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise r.fail("profiles", f"duplicate schedulerName {dupes}")
    le = LeaderElection(
        leader_elect=leader_elect,
        resource_name=r.string(le_raw, "resourceName", "leaderElection", lease_name(names)),
        resource_namespace=r.string(le_raw, "resourceNamespace", "leaderElection", "kube-system"),
        lease_duration_s=r.duration(le_raw, "leaseDuration", "leaderElection", 15),
        renew_deadline_s=r.duration(le_raw, "renewDeadline", "leaderElection", 10),
        retry_period_s=r.duration(le_raw, "retryPeriod", "leaderElection", 2),
    )
    if not le.retry_period_s < le.renew_deadline_s < le.lease_duration_s:
        raise r.fail("leaderElection", "needs retryPeriod < renewDeadline < leaseDuration")
    require_owner = top.get("requireNodeOwner", False)
    if not isinstance(require_owner, bool):
        raise r.fail("requireNodeOwner", f"must be true or false, got {require_owner!r}")
    initial = r.number(top, "podInitialBackoffSeconds", "config", 1, 0.001)
    maximum = r.number(top, "podMaxBackoffSeconds", "config", 10, 0.001)
    if maximum < initial:
        raise r.fail("podMaxBackoffSeconds", "must be >= podInitialBackoffSeconds")
    pct = int(r.number(top, "percentageOfNodesToScore", "config", 0, 0, integer=True))
    if pct > 100:
        raise r.fail("percentageOfNodesToScore", f"must be 0..100, got {pct}")
    return Config(
        profiles=tuple(profiles),
        qps=r.number(client, "qps", "clientConnection", 50, 0.001),
        burst=int(r.number(client, "burst", "clientConnection", 100, 1, integer=True)),
        leader_election=le,
        percentage_of_nodes_to_score=pct,
        pod_initial_backoff_s=initial,
        pod_max_backoff_s=maximum,
        bind_workers=int(r.number(top, "bindWorkers", "config", 192, 1, integer=True)),
        node_owner_label=r.string(top, "nodeOwnerLabel", "config", DEFAULT_NODE_OWNER_LABEL),
        require_node_owner=require_owner,
        source=source,
    )


def load_config(path: str | Path | None, scheduler_name: str | None = None) -> Config:
    """The built-in defaults when `path` is None, else the file (ConfigError when unusable)."""
    if path is None:
        return parse_config({}, "<defaults>", scheduler_name)
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    return parse_config(data, source, scheduler_name)
