"""What a pod asks of devices, parsed and validated once per pod."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar

from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.proto.pkg.protocol.assignment import peak_use
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import whole_kinds
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo

POLICIES = ("binpack", "spread")
K = TypeVar("K", bound=Hashable)


class RequestError(ValueError):
    """A device request that can never be satisfied as written; the message says why."""


@dataclasses.dataclass(frozen=True)
class ContainerAsk:
    """One container's device ask: whole devices of one kind, one slice, or MIG instances."""

    container: str
    kind: str = ""
    whole: int = 0
    core: int = 0
    memory: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    reuse: bool = False
    """An init container that runs to completion: the kubelet hands its devices to the
    containers started after it, so it is placed on the pod's own devices."""
    sidecar: bool = False
    """A restartable init container: it runs beside every container declared after it."""

    @property
    def is_slice(self) -> bool:
        return self.core > 0 or self.memory > 0


@dataclasses.dataclass(frozen=True)
class DeviceRequest:
    """A pod's device asks; the derived facts are computed once (they are read per node)."""

    asks: tuple[ContainerAsk, ...]
    policy_override: str | None

    def peak(self, use: Callable[[ContainerAsk], Mapping[K, int]]) -> dict[K, int]:
        """The pod's `peak_use` of what `use` reads from each ask (asks keep the pod's
        order: app containers, then init containers as declared)."""
        return peak_use(
            ((a.sidecar, use(a)) for a in self.asks if a.reuse or a.sidecar),
            (use(a) for a in self.asks if not (a.reuse or a.sidecar)),
        )

    @cached_property
    def whole_total(self) -> Mapping[str, int]:
        """Whole devices the pod holds per kind (`peak_use`: an init container reuses the
        pod's devices, except those of the sidecars declared before it)."""
        return MappingProxyType(self.peak(lambda a: {a.kind: a.whole} if a.whole else {}))

    @cached_property
    def only_whole(self) -> bool:
        return all(a.whole for a in self.asks) and len({a.kind for a in self.asks}) == 1

    @cached_property
    def only_slices(self) -> bool:
        return all(a.is_slice for a in self.asks)

    def mig_profiles(self) -> set[str]:
        return {p for a in self.asks for p, _ in a.mig}

    def max_whole_per_container(self) -> int:
        return max((a.whole for a in self.asks), default=0)


def parse_device_request(pod: PodInfo, protocol: Protocol) -> DeviceRequest | None:
    """None when the pod asks for no device; RequestError for a malformed ask."""
    res = protocol.resources
    kinds = whole_kinds(protocol)
    asks: list[ContainerAsk] = []
    for c in pod.containers:
        where = f"{'init container' if c.init else 'container'} {c.name!r}"
        whole: dict[str, int] = {}
        core = memory = 0
        migs: list[tuple[str, int]] = []
        for name, value in c.requests.items():
            if value <= 0:
                continue
            if name in kinds:
                whole[kinds[name]] = value
            elif name == res.core:
                core = value
            elif name == res.memory:
                memory = value
            else:
                profile = res.mig_profile(name)
                if profile is not None:
                    migs.append((profile, value))
        for name, value in ((res.core, core), (res.memory, memory)):
            if value > 100:
                raise RequestError(
                    f"{where} asks for {value} of {name}: a slice is at most 100 (one device); "
                    f"ask for whole devices with {res.gpu} instead"
                )
        sliced = core > 0 or memory > 0
        used = [bool(whole), sliced, bool(migs)]
        if sum(used) > 1:
            raise RequestError(
                f"{where} mixes whole devices ({', '.join(sorted(whole)) or 'none'}), a TDM slice "
                f"({res.core}/{res.memory}) and MIG instances: a container asks for exactly one "
                "of the three"
            )
        if len(whole) > 1:
            raise RequestError(f"{where} asks for whole devices of several kinds {sorted(whole)}")
        ask = ContainerAsk(c.name, kind="gpu", reuse=c.init and not c.sidecar, sidecar=c.sidecar)
        if whole:
            ((kind, count),) = whole.items()
            asks.append(dataclasses.replace(ask, kind=kind, whole=count))
        elif sliced:
            asks.append(dataclasses.replace(ask, core=core, memory=memory))
        elif migs:
            asks.append(dataclasses.replace(ask, mig=tuple(sorted(migs))))
    if not asks:
        return None
    override = pod.annotations.get(protocol.annotations.gpu_policy)
    if override is not None and override not in POLICIES:
        raise RequestError(
            f"annotation {protocol.annotations.gpu_policy}={override!r} is not one of "
            f"{', '.join(POLICIES)}"
        )
    return DeviceRequest(tuple(asks), override)
