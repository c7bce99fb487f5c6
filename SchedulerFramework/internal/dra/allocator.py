"""Allocation of ResourceClaims on one node's devices (upstream's structured allocator,
k8s.io/dynamic-resource-allocation/structured, for node-local devices).

For each request, in order: its alternatives (`exactly`, or `firstAvailable` in order),
the devices its DeviceClass's and its own CEL selectors match, taints it does not tolerate
left out, `count` of them (`allocationMode: All`: every match, all free). A device that
allows several allocations is shared by capacity: each allocation consumes what its
request asks (rounded by the capacity's request policy; the default when not asked) and
all of them fit the device. Any other device is held by one claim. Devices that consume
counters fit their counter sets. `matchAttribute` constraints hold across the requests they
name. Shared devices are tried fullest first (binpack: whole devices stay free for whole
requests); the search backtracks, at most `MAX_STEPS` device choices per node.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from lj_runtimekit.schedulerframework.internal.dra.cel import SelectorError
from lj_runtimekit.schedulerframework.internal.dra.objects import (
    Allocation,
    Claim,
    ClaimRequest,
    Constraint,
    CounterKey,
    Device,
    DeviceKey,
    Request,
    Result,
)
from lj_runtimekit.schedulerframework.internal.dra.state import (
    MAX_DEVICE_SELECTIONS,
    DraState,
    Selection,
)

MAX_STEPS = 10_000
NO_SCHEDULE_EFFECTS = ("NoSchedule", "NoExecute")


class ClaimProblem(ValueError):
    """A claim no node can serve as it is (a selector that does not compile, admin access):
    the message names the claim and the request."""


@dataclass(frozen=True)
class ClaimAllocation:
    """What one claim gets on the node."""

    claim: Claim
    results: tuple[Result, ...]
    config: tuple[Mapping[str, Any], ...]


def _norm(driver: str, name: str) -> str:
    domain, _, short = name.rpartition("/")
    return short if not domain or domain == driver else name


def _applies(constraint: Constraint, request: str) -> bool:
    return (
        not constraint.requests
        or request.split("/")[0] in constraint.requests
        or (request in constraint.requests)
    )


class _Search:
    def __init__(self, state: DraState, node: str, claims: Sequence[Claim]) -> None:
        self.state = state
        self.selectors = state.selectors
        self.devices = state.node_devices.get(node, ())
        self.node = node
        self._counters_used: dict[CounterKey, dict[str, Decimal]] | None = None
        self.claims = claims
        self.taken: dict[DeviceKey, list[Mapping[str, Decimal]]] = {}
        self.chosen: list[tuple[Claim, Request, Device, Mapping[str, Decimal]]] = []
        self.steps = 0
        self.reasons: set[str] = set()

    # -- what a device offers -----------------------------------------------------------

    def matches(self, device: Device, request: Request, reasons: set[str] | None = None) -> bool:
        """Whether the request's class and selectors select the device, taints tolerated;
        a selector's error goes to `reasons` (default: the search's)."""
        device_class = self.state.classes[request.class_name]
        for expression in (*device_class.selectors, *request.selectors):
            memo = device.matches.get(expression)
            if memo is None:
                memo = self.selectors.get(expression).matches(device.cel_view())
                device.matches[expression] = memo
            if not memo[0]:
                if memo[1]:
                    (self.reasons if reasons is None else reasons).add(memo[1])
                return False
        return all(
            any(t.tolerates(taint) for t in request.tolerations)
            for taint in device.taints
            if taint.effect in NO_SCHEDULE_EFFECTS
        )

    def selected(self, request: Request) -> Selection:
        """The node's devices `matches` selects for the request, each with what the request
        would take of it (`_consumption`); memoized per node and request shape until
        devices or classes change."""
        key = (
            self.node,
            request.class_name,
            request.selectors,
            request.tolerations,
            tuple(sorted(request.capacity.items())),
        )
        memo = self.state.devices_matching.get(key)
        if memo is None:
            reasons: set[str] = set()
            found = tuple(
                (d, self._consumption(d, request))
                for d in self.devices
                if self.matches(d, request, reasons)
            )
            if len(self.state.devices_matching) >= MAX_DEVICE_SELECTIONS:
                self.state.devices_matching.clear()
            memo = self.state.devices_matching[key] = (found, frozenset(reasons))
        self.reasons |= memo[1]
        return memo[0]

    def _consumption(self, device: Device, request: Request) -> Mapping[str, Decimal] | None:
        """What the request takes of a shared device, {} of another one; None: it cannot."""
        asked = {_norm(device.driver, k): v for k, v in request.capacity.items()}
        offered = {_norm(device.driver, k): c for k, c in device.capacity.items()}
        if any(name not in offered for name in asked):
            return None
        if not device.allow_multiple:
            return {} if all(asked[n] <= offered[n].value for n in asked) else None
        consumed: dict[str, Decimal] = {}
        for name, cap in device.capacity.items():
            short = _norm(device.driver, name)
            want = asked.get(short)
            amount = (
                cap.policy.consumed(want, cap.value)
                if cap.policy is not None
                else (want if want is not None else cap.value)
            )
            if amount is None or amount > cap.value:
                return None
            consumed[name] = amount
        return consumed

    def _in_use(self, device: Device) -> bool:
        return self.state.usage(device.key) is not None or device.key in self.taken

    def _fits(self, device: Device, consumed: Mapping[str, Decimal]) -> bool:
        if not device.allow_multiple and self._in_use(device):
            return False
        if device.allow_multiple:
            usage = self.state.usage(device.key)
            for name, amount in consumed.items():
                held = usage.consumed.get(name, Decimal(0)) if usage else Decimal(0)
                held += sum(
                    (c.get(name, Decimal(0)) for c in self.taken.get(device.key, ())), Decimal(0)
                )
                if held + amount > device.capacity[name].value:
                    return False
        if device.consumes and not self._in_use(device):
            for set_name, counters in device.consumes:
                key: CounterKey = (device.driver, device.pool, set_name)
                offered = self.state.counter_sets.get(key)
                if offered is None:
                    return False
                used = self._counters(key)
                for name, amount in counters.items():
                    if used.get(name, Decimal(0)) + amount > offered.get(name, Decimal(0)):
                        return False
        return True

    def _counters(self, key: CounterKey) -> dict[str, Decimal]:
        if self._counters_used is None:  # worked out once, for devices that consume counters
            self._counters_used = self.state.counters_used(self.node)
        used = dict(self._counters_used.get(key, {}))
        for taken in self.taken:
            device = self.state.device(taken)
            if device is None or self.state.usage(taken) is not None:
                continue
            for set_name, counters in device.consumes:
                if (device.driver, device.pool, set_name) == key:
                    for name, amount in counters.items():
                        used[name] = used.get(name, Decimal(0)) + amount
        return used

    def _fullness(self, device: Device) -> Decimal:
        usage = self.state.usage(device.key)
        if not device.allow_multiple or usage is None:
            return Decimal(0)
        return sum(
            (
                used / device.capacity[n].value
                for n, used in usage.consumed.items()
                if n in device.capacity and device.capacity[n].value
            ),
            Decimal(0),
        )

    def _constraints_hold(self, claim: Claim, request: Request, device: Device) -> bool:
        for constraint in claim.constraints:
            if not _applies(constraint, request.name):
                continue
            value = device.attribute(constraint.attribute)
            if value is None:
                return False
            if any(
                other_claim is claim
                and _applies(constraint, other_request.name)
                and other.attribute(constraint.attribute) != value
                for other_claim, other_request, other, _ in self.chosen
            ):
                return False
        return True

    # -- the search ---------------------------------------------------------------------

    def _candidates(self, request: Request) -> list[tuple[Device, Mapping[str, Decimal]]] | None:
        """Devices that may serve the request, best first; None: an `All` request that
        cannot have all of its devices."""
        out = []
        for device, consumed in self.selected(request):
            if consumed is None:
                if request.all_devices:
                    return None
                continue
            out.append((device, consumed))
        if request.all_devices and not out:
            return None
        out.sort(key=lambda dc: -self._fullness(dc[0]))
        return out

    def run(self) -> bool:
        requests = [(c, r) for c in self.claims for r in c.requests]
        return self._request(requests, 0)

    def _request(self, requests: list[tuple[Claim, ClaimRequest]], i: int) -> bool:
        if i == len(requests):
            return True
        claim, claim_request = requests[i]
        for request in claim_request.alternatives:
            candidates = self._candidates(request)
            if candidates is None:
                continue
            count = len(candidates) if request.all_devices else request.count
            if self._pick(requests, i, claim, request, candidates, count, 0):
                return True
        return False

    def _pick(
        self,
        requests: list[tuple[Claim, ClaimRequest]],
        i: int,
        claim: Claim,
        request: Request,
        candidates: list[tuple[Device, Mapping[str, Decimal]]],
        left: int,
        start: int,
    ) -> bool:
        if left == 0:
            return self._request(requests, i + 1)
        for j in range(start, len(candidates)):
            self.steps += 1
            if self.steps > MAX_STEPS:
                self.reasons.add(f"more than {MAX_STEPS} device choices tried")
                return False
            device, consumed = candidates[j]
            if not self._fits(device, consumed) or not self._constraints_hold(
                claim, request, device
            ):
                if request.all_devices:
                    return False
                continue
            self.taken.setdefault(device.key, []).append(consumed)
            self.chosen.append((claim, request, device, consumed))
            if self._pick(requests, i, claim, request, candidates, left - 1, j + 1):
                return True
            self.chosen.pop()
            self.taken[device.key].pop()
            if not self.taken[device.key]:
                del self.taken[device.key]
        return False


def candidate_nodes(state: DraState, claims: Sequence[Claim]) -> list[str]:
    """The nodes with, for every request of the claims, a device one of its alternatives
    selects (free or not), fullest first among those with room; the device match per node
    is memoized until devices or classes change. Callers checked each claim."""
    key = tuple(
        tuple((r.class_name, r.selectors, r.tolerations) for r in claim_request.alternatives)
        for claim in claims
        for claim_request in claim.requests
    )
    nodes = state.nodes_matching.get(key)
    if nodes is None:
        search = _Search(state, "", claims)
        nodes = [
            node
            for node, devices in state.node_devices.items()
            if all(
                any(any(search.matches(d, r) for d in devices) for r in claim_request.alternatives)
                for claim in claims
                for claim_request in claim.requests
            )
        ]
        state.nodes_matching[key] = nodes
    return state.rank_by_room(nodes)


def check_claim(claim: Claim, state: DraState) -> str | None:
    """Why no node can serve the claim as it is: a ClaimProblem for what the claim must
    change, or a reason that may pass (a DeviceClass not there yet); None: it may fit."""
    for claim_request in claim.requests:
        for request in claim_request.alternatives:
            where = f"ResourceClaim {claim.key} request {request.name}"
            if request.admin_access:
                raise ClaimProblem(f"{where}: admin access is not served")
            device_class = state.classes.get(request.class_name)
            if device_class is None:
                return f"{where}: DeviceClass {request.class_name!r} not found"
            try:
                for expression in (*device_class.selectors, *request.selectors):
                    state.selectors.get(expression)
            except SelectorError as exc:
                raise ClaimProblem(f"{where}: {exc}") from None
    return None


def allocate(
    state: DraState, node: str, claims: Sequence[Claim]
) -> tuple[list[ClaimAllocation] | None, str]:
    """The claims' allocations on the node, or None and why not. Callers checked each claim
    with `check_claim`."""
    if not claims:
        return [], ""
    search = _Search(state, node, claims)
    if not search.run():
        why = "; ".join(sorted(search.reasons)[:3])
        names = ", ".join(c.key for c in claims)
        return None, f"cannot allocate ResourceClaim(s) {names}" + (f" ({why})" if why else "")
    out = []
    for claim in claims:
        results = tuple(
            Result(
                request=request.name,
                driver=device.driver,
                pool=device.pool,
                device=device.name,
                consumed=consumed if device.allow_multiple else {},
                share_id=str(uuid.uuid4()) if device.allow_multiple else "",
            )
            for c, request, device, consumed in search.chosen
            if c is claim
        )
        out.append(ClaimAllocation(claim, results, _config(state, claim, results)))
    return out, ""


def _config(
    state: DraState, claim: Claim, results: Sequence[Result]
) -> tuple[Mapping[str, Any], ...]:
    """The allocation's `devices.config`: each used class's config, then the claim's."""
    by_class: dict[str, list[str]] = {}
    for claim_request in claim.requests:
        for request in claim_request.alternatives:
            if any(r.request == request.name for r in results):
                by_class.setdefault(request.class_name, []).append(request.name)
    config: list[Mapping[str, Any]] = []
    for class_name, names in by_class.items():
        device_class = state.classes.get(class_name)
        for entry in device_class.config if device_class else ():
            if entry.get("opaque"):
                config.append({"source": "FromClass", "requests": names, "opaque": entry["opaque"]})
    for entry in claim.config:
        if entry.get("opaque"):
            item: dict[str, Any] = {"source": "FromClaim", "opaque": entry["opaque"]}
            if entry.get("requests"):
                item["requests"] = list(entry["requests"])
            config.append(item)
    return tuple(config)


def copies_that_fit(state: DraState, node: str, claims: Sequence[Claim], limit: int) -> int:
    """How many pods, each with its own claims like these, fit on the node (at most
    `limit`): a gang's planner counts its members per node this way."""
    held: list[str] = []
    try:
        while len(held) < limit * max(1, len(claims)):
            copy = len(held)
            twins = [dataclasses.replace(c, uid=f"{c.uid}/copy-{copy}") for c in claims]
            planned, _ = allocate(state, node, twins)
            if planned is None:
                break
            for item in planned:
                state.assume(item.claim, Allocation(node, item.results))
                held.append(item.claim.uid)
    finally:
        for uid in held:
            state.forget(uid)
    return len(held) // max(1, len(claims))


def node_fullness(state: DraState, node: str, extra: int = 0) -> float:
    """Share of the node's devices in use (with `extra` more): the binpack score's base."""
    devices = state.node_devices.get(node, ())
    if not devices:
        return 0.0
    return min(1.0, (state.devices_in_use(node) + extra) / len(devices))
