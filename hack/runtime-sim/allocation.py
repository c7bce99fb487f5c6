"""Container allocations: the sharing rules and the ledger of what each container holds."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from lj_runtimekit.runtimesim.inventory import DeviceInfo, MigInstanceInfo
from lj_runtimekit.runtimesim.state import NodeState

log = logging.getLogger(__name__)

WHOLE = 100


class AllocationError(Exception):
    """An allocation is refused; ``code`` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Grant:
    """What a container gets from one device or MIG instance (percentages 0..100).

    100/100 is the whole device; a TDM slice has at least one percentage above 0,
    and 0 means none of that resource (a core-only or memory-only slice).
    """

    device_id: str
    core_percent: int
    memory_percent: int

    @property
    def whole(self) -> bool:
        """True when the container gets the whole device."""
        return self.core_percent == WHOLE and self.memory_percent == WHOLE


@dataclass(frozen=True)
class Target:
    """A resolved grant: the device, and the MIG instance when one is asked for."""

    grant: Grant
    device: DeviceInfo
    instance: MigInstanceInfo | None


@dataclass(frozen=True)
class AllocationRequest:
    """One container's request, as received."""

    container_key: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    container_name: str
    grants: tuple[Grant, ...]
    init_container: bool = False
    claim_uid: str = ""
    claim_name: str = ""

    @property
    def pod(self) -> str:
        """The holder's identity: a DRA claim's UID, else the pod's UID, else the container
        key's pod part."""
        return self.claim_uid or self.pod_uid or self.container_key.partition("/")[0]


@dataclass(frozen=True)
class ContainerAllocation:
    """One container's reservation."""

    request: AllocationRequest
    targets: tuple[Target, ...]


class Allocator:
    """Checks requests against the sharing rules and records what each container holds."""

    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._held: dict[str, ContainerAllocation] = {}

    def allocations(self) -> tuple[ContainerAllocation, ...]:
        """Every allocation, ordered by container key."""
        return tuple(self._held[key] for key in sorted(self._held))

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        """Reserve what the request asks for and return the allocation.

        The same request again for a container returns its existing allocation.
        Raises AllocationError naming the device and container on any violation.
        """
        key = request.container_key
        if not key:
            raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, "container_key is empty")
        existing = self._held.get(key)
        if existing is not None:
            if existing.request.grants == request.grants:
                return existing
            raise AllocationError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"container {key} already holds a different allocation; release it first",
            )
        if not request.grants:
            raise AllocationError(
                grpc.StatusCode.INVALID_ARGUMENT, f"container {key} asks for no device"
            )
        targets = tuple(self._check(request, grant) for grant in request.grants)
        allocation = ContainerAllocation(request, targets)
        self._held[key] = allocation
        log.info(
            "container allocated container=%s devices=%s",
            key,
            ",".join(g.device_id for g in request.grants),
        )
        return allocation

    def release(self, container_key: str) -> bool:
        """Free a container's allocation; return False when it held none."""
        if self._held.pop(container_key, None) is None:
            return False
        log.info("container released container=%s", container_key)
        return True

    def _check(self, request: AllocationRequest, grant: Grant) -> Target:
        key, grants = request.container_key, request.grants
        dev = grant.device_id
        invalid, precondition = (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        if sum(1 for g in grants if g.device_id == dev) > 1:
            raise AllocationError(invalid, f"container {key} asks for device {dev} more than once")
        for name, value in (("core", grant.core_percent), ("memory", grant.memory_percent)):
            if not 0 <= value <= WHOLE:
                raise AllocationError(
                    invalid,
                    f"container {key} asks for {value}% {name} of device {dev}; "
                    "a slice must be 0..100 of each",
                )
        if grant.core_percent == 0 and grant.memory_percent == 0:
            raise AllocationError(
                invalid, f"container {key} asks for a slice of device {dev} with 0% core and memory"
            )
        instance = self._state.mig_instance(dev)
        device = self._state.device(instance.parent_id if instance else dev)
        if device is None:
            raise AllocationError(invalid, f"container {key} asks for unknown device {dev}")
        if instance is None and device.mode == "mig":
            raise AllocationError(
                precondition,
                f"device {dev} asked for by container {key} is in MIG mode; "
                "ask for one of its MIG instances",
            )
        if not grant.whole and (instance is not None or device.mode != "tdm"):
            what = "MIG instance" if instance else f"{device.mode}-mode device"
            raise AllocationError(
                precondition,
                f"container {key} asks for a slice of {what} {dev}; only TDM devices are sliced",
            )
        health = self._state.health(dev)
        if not health.healthy:
            raise AllocationError(
                precondition,
                f"device {dev} asked for by container {key} is unhealthy: {health.reason}",
            )
        self._check_capacity(request, grant)
        return Target(grant, device, instance)

    def _check_capacity(self, request: AllocationRequest, grant: Grant) -> None:
        """The device has room: other pods count with their effective use (per pod, the
        larger of its init and app use); the pod's own init containers overlap its other
        containers (the kubelet gives their devices to the app containers again)."""
        dev, key = grant.device_id, request.container_key
        exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
        holders = list(self._pod_use(dev, request).items())
        for holder, held in holders:
            if held.whole:
                raise AllocationError(
                    exhausted,
                    f"device {dev} asked for by container {key} is held whole by {holder}",
                )
        if grant.whole and holders:
            names = ", ".join(sorted(holder for holder, _ in holders))
            raise AllocationError(
                exhausted,
                f"container {key} asks for device {dev} whole but it carries slices of {names}",
            )
        for name, asked, used in (
            ("core", grant.core_percent, sum(g.core_percent for _, g in holders)),
            ("memory", grant.memory_percent, sum(g.memory_percent for _, g in holders)),
        ):
            if used + asked > WHOLE:
                raise AllocationError(
                    exhausted,
                    f"container {key} asks for {asked}% {name} of device {dev}; "
                    f"only {WHOLE - used}% is free",
                )

    def _pod_use(self, dev: str, request: AllocationRequest) -> dict[str, Grant]:
        """What each holder of `dev` uses of it, as the request must see it: other pods'
        effective use, keyed by a container key; the own pod's app containers one by one
        (nothing of the own pod when the request is an init container's)."""
        init: dict[str, tuple[str, Grant]] = {}
        app: dict[str, list[tuple[str, Grant]]] = {}
        out: dict[str, Grant] = {}
        for other in self._held.values():
            asked = other.request
            for g in asked.grants:
                if g.device_id != dev:
                    continue
                if asked.pod == request.pod:
                    if not request.init_container and not asked.init_container:
                        out[asked.container_key] = g
                elif asked.init_container:
                    prev = init.get(asked.pod)
                    init[asked.pod] = (asked.container_key, _larger(prev[1], g) if prev else g)
                else:
                    app.setdefault(asked.pod, []).append((asked.container_key, g))
        for pod in init.keys() | app.keys():
            apps = [g for _, g in app.get(pod, [])]
            use = _sum(apps) if apps else None
            if pod in init:
                use = _larger(init[pod][1], use) if use else init[pod][1]
            holder = init[pod][0] if pod in init else app[pod][0][0]
            if use is not None:
                out[holder] = use
        return out


def _sum(grants: Sequence[Grant]) -> Grant:
    """Several containers' use of one device as one grant (whole wins)."""
    dev = grants[0].device_id
    if any(g.whole for g in grants):
        return Grant(dev, WHOLE, WHOLE)
    return Grant(dev, sum(g.core_percent for g in grants), sum(g.memory_percent for g in grants))


def _larger(a: Grant, b: Grant) -> Grant:
    """The larger use of two, per resource (whole wins)."""
    if a.whole or b.whole:
        return Grant(a.device_id, WHOLE, WHOLE)
    return Grant(
        a.device_id, max(a.core_percent, b.core_percent), max(a.memory_percent, b.memory_percent)
    )
