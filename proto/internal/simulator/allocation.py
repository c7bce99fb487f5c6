"""Container allocations: the sharing rules and the ledger of what each container holds."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from lj_runtimekit.proto.internal.simulator.inventory import DeviceInfo, MigInstanceInfo
from lj_runtimekit.proto.internal.simulator.state import NodeState

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
    """What a container gets from one device or MIG instance (percentages 1..100)."""

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
        targets = tuple(self._check(key, grant, request.grants) for grant in request.grants)
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

    def _check(self, key: str, grant: Grant, grants: Sequence[Grant]) -> Target:
        dev = grant.device_id
        invalid, precondition = (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        if sum(1 for g in grants if g.device_id == dev) > 1:
            raise AllocationError(invalid, f"container {key} asks for device {dev} more than once")
        for name, value in (("core", grant.core_percent), ("memory", grant.memory_percent)):
            if not 1 <= value <= WHOLE:
                raise AllocationError(
                    invalid,
                    f"container {key} asks for {value}% {name} of device {dev}; "
                    "a slice must be 1..100 (0 or 100 means the whole device)",
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
        self._check_capacity(key, grant)
        return Target(grant, device, instance)

    def _check_capacity(self, key: str, grant: Grant) -> None:
        dev = grant.device_id
        holders = [
            (other.request.container_key, g)
            for other in self._held.values()
            for g in other.request.grants
            if g.device_id == dev
        ]
        exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
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
