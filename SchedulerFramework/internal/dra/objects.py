"""resource.k8s.io/v1 objects as the allocator reads them: the devices of ResourceSlices,
DeviceClasses, ResourceClaims and their allocations.

Parsing never raises for what the API server accepted: a field this scheduler does not
serve is kept out of the model (and named where it matters, see `Request.unsupported`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from lj_runtimekit.proto.pkg.quantity import QuantityError, parse_quantity
from lj_runtimekit.schedulerframework.internal.dra.cel import cel_quantity

API = "/apis/resource.k8s.io/v1"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
"""The finalizer kube-scheduler puts on a claim it allocates (the claim controller takes it
off once the allocation is gone)."""
MAX_RESERVED_FOR = 256
"""At most this many consumers of one claim (`status.reservedFor`, the API's limit)."""

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): a device's name across the cluster."""
CounterKey = tuple[str, str, str]
"""(driver, pool, counter set)."""


def _quantity(raw: object) -> Decimal | None:
    try:
        return parse_quantity(raw)
    except QuantityError:
        return None


def _qualified(driver: str, name: str) -> tuple[str, str]:
    """(domain, name) of an attribute or capacity name, unqualified ones in the driver's."""
    domain, _, short = name.rpartition("/")
    return (domain or driver), short


@dataclass(frozen=True)
class RequestPolicy:
    """A consumable capacity's `requestPolicy`: default, and the valid values."""

    default: Decimal | None = None
    minimum: Decimal | None = None
    maximum: Decimal | None = None
    step: Decimal | None = None
    valid_values: tuple[Decimal, ...] = ()

    def consumed(self, requested: Decimal | None, value: Decimal) -> Decimal | None:
        """What a request of `requested` (None: not asked) consumes, None when no valid
        amount serves it (upstream's request policy rounding: up to the next valid value)."""
        want = requested if requested is not None else self.default
        if want is None:
            return value
        if self.valid_values:
            return next((v for v in sorted(self.valid_values) if v >= want), None)
        low = self.minimum if self.minimum is not None else Decimal(0)
        if want < low:
            want = low
        if self.step is not None and self.step > 0:
            steps = ((want - low) / self.step).to_integral_value(rounding=ROUND_CEILING)
            want = low + steps * self.step
        if self.maximum is not None and want > self.maximum:
            return None
        return want


@dataclass(frozen=True)
class Capacity:
    value: Decimal
    policy: RequestPolicy | None


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(eq=False)
class Device:
    """One device of a ResourceSlice."""

    driver: str
    pool: str
    name: str
    node: str
    attributes: Mapping[str, Mapping[str, Any]]
    """domain -> name -> value (int, bool, str; versions as their text)"""
    capacity: Mapping[str, Capacity]
    """qualified name -> capacity"""
    allow_multiple: bool
    consumes: tuple[tuple[str, Mapping[str, Decimal]], ...]
    """(counter set, counter -> amount) this device takes while allocated"""
    taints: tuple[Taint, ...]
    matches: dict[str, tuple[bool, str]] = field(default_factory=dict)
    """memo: selector expression -> (matches, runtime error)"""

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    def attribute(self, qualified: str) -> Any:
        domain, name = _qualified(self.driver, qualified)
        return (self.attributes.get(domain) or {}).get(name)

    def cel_view(self) -> dict[str, Any]:
        capacity: dict[str, dict[str, Any]] = {}
        for qualified, cap in self.capacity.items():
            domain, name = _qualified(self.driver, qualified)
            capacity.setdefault(domain, {})[name] = cel_quantity(cap.value)
        return {
            "driver": self.driver,
            "allowMultipleAllocations": self.allow_multiple,
            "attributes": {d: dict(a) for d, a in self.attributes.items()},
            "capacity": capacity,
        }


def _attribute_value(raw: Mapping[str, Any]) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return raw[kind]
    return None


def _policy(raw: Mapping[str, Any] | None) -> RequestPolicy | None:
    if not raw:
        return None
    valid_range = raw.get("validRange") or {}
    return RequestPolicy(
        default=_quantity(raw["default"]) if "default" in raw else None,
        minimum=_quantity(valid_range["min"]) if "min" in valid_range else None,
        maximum=_quantity(valid_range["max"]) if "max" in valid_range else None,
        step=_quantity(valid_range["step"]) if "step" in valid_range else None,
        valid_values=tuple(
            q for q in (_quantity(v) for v in raw.get("validValues") or ()) if q is not None
        ),
    )


def _counters(raw: Mapping[str, Any] | None) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for name, counter in (raw or {}).items():
        value = _quantity((counter or {}).get("value"))
        if value is not None:
            out[str(name)] = value
    return out


def parse_device(driver: str, pool: str, node: str, raw: Mapping[str, Any]) -> Device:
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (raw.get("attributes") or {}).items():
        domain, short = _qualified(driver, str(name))
        attributes.setdefault(domain, {})[short] = _attribute_value(value or {})
    capacity: dict[str, Capacity] = {}
    for name, cap in (raw.get("capacity") or {}).items():
        value = _quantity((cap or {}).get("value"))
        if value is not None:
            capacity[str(name)] = Capacity(value, _policy((cap or {}).get("requestPolicy")))
    return Device(
        driver=driver,
        pool=pool,
        name=str(raw.get("name", "")),
        node=node,
        attributes=attributes,
        capacity=capacity,
        allow_multiple=bool(raw.get("allowMultipleAllocations")),
        consumes=tuple(
            (str(c.get("counterSet", "")), _counters(c.get("counters")))
            for c in raw.get("consumesCounters") or ()
        ),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
            for t in raw.get("taints") or ()
        ),
    )


@dataclass(frozen=True)
class Slice:
    """One ResourceSlice (only node-local ones, `spec.nodeName`, are kept)."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str
    devices: tuple[Device, ...]
    counter_sets: Mapping[str, Mapping[str, Decimal]]


def parse_slice(obj: Mapping[str, Any]) -> Slice | None:
    """The slice, or None when it is not bound to one node."""
    spec = obj.get("spec") or {}
    node = str(spec.get("nodeName") or "")
    if not node:
        return None
    driver = str(spec.get("driver", ""))
    pool = spec.get("pool") or {}
    pool_name = str(pool.get("name", ""))
    return Slice(
        name=str((obj.get("metadata") or {}).get("name", "")),
        driver=driver,
        pool=pool_name,
        generation=int(pool.get("generation") or 0),
        slice_count=int(pool.get("resourceSliceCount") or 1),
        node=node,
        devices=tuple(parse_device(driver, pool_name, node, d) for d in spec.get("devices") or ()),
        counter_sets={
            str(c.get("name", "")): _counters(c.get("counters"))
            for c in spec.get("sharedCounters") or ()
        },
    )


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[Mapping[str, Any], ...]


def parse_class(obj: Mapping[str, Any]) -> DeviceClass:
    spec = obj.get("spec") or {}
    return DeviceClass(
        name=str((obj.get("metadata") or {}).get("name", "")),
        selectors=_selectors(spec.get("selectors")),
        config=tuple(spec.get("config") or ()),
    )


def _selectors(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(str((s.get("cel") or {}).get("expression", "")) for s in raw if s.get("cel"))


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class Request:
    """One way to serve a request: `exactly`, or one subrequest of `firstAvailable`
    (`name` is then `<request>/<subrequest>`, as the allocation names it)."""

    name: str
    class_name: str
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    capacity: Mapping[str, Decimal]
    tolerations: tuple[Toleration, ...]
    admin_access: bool


def _request(name: str, raw: Mapping[str, Any]) -> Request:
    requests = ((raw.get("capacity") or {}).get("requests")) or {}
    return Request(
        name=name,
        class_name=str(raw.get("deviceClassName", "")),
        selectors=_selectors(raw.get("selectors")),
        all_devices=raw.get("allocationMode") == "All",
        count=int(raw.get("count") or 1),
        capacity={
            str(k): q for k, q in ((k, _quantity(v)) for k, v in requests.items()) if q is not None
        },
        tolerations=tuple(
            Toleration(
                str(t.get("key", "")),
                str(t.get("operator") or "Equal"),
                str(t.get("value", "")),
                str(t.get("effect", "")),
            )
            for t in raw.get("tolerations") or ()
        ),
        admin_access=bool(raw.get("adminAccess")),
    )


@dataclass(frozen=True)
class ClaimRequest:
    """A request of a claim: its alternatives in order (one for `exactly`)."""

    name: str
    alternatives: tuple[Request, ...]


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]
    """the requests it binds (empty: all of them)"""
    attribute: str
    """qualified attribute every device of those requests must have the same value of"""


@dataclass(frozen=True)
class Result:
    """One device of an allocation."""

    request: str
    driver: str
    pool: str
    device: str
    consumed: Mapping[str, Decimal]
    share_id: str = ""

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.share_id:
            out["shareID"] = self.share_id
        if self.consumed:
            out["consumedCapacity"] = {k: str(v) for k, v in self.consumed.items()}
        return out


@dataclass(frozen=True)
class Allocation:
    node: str
    """the node its nodeSelector names ("" when it names none this scheduler reads)"""
    results: tuple[Result, ...]


def _allocation_node(raw: Mapping[str, Any]) -> str:
    for term in (raw.get("nodeSelector") or {}).get("nodeSelectorTerms") or ():
        for field_req in term.get("matchFields") or ():
            values = list(field_req.get("values") or ())
            if (
                field_req.get("key") == "metadata.name"
                and field_req.get("operator") == "In"
                and len(values) == 1
            ):
                return str(values[0])
    return ""


def parse_allocation(raw: Mapping[str, Any] | None) -> Allocation | None:
    if not raw:
        return None
    results = tuple(
        Result(
            request=str(r.get("request", "")),
            driver=str(r.get("driver", "")),
            pool=str(r.get("pool", "")),
            device=str(r.get("device", "")),
            consumed={
                str(k): q
                for k, q in (
                    (k, _quantity(v)) for k, v in (r.get("consumedCapacity") or {}).items()
                )
                if q is not None
            },
            share_id=str(r.get("shareID") or ""),
        )
        for r in (raw.get("devices") or {}).get("results") or ()
    )
    return Allocation(_allocation_node(raw), results)


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    resource_version: str
    requests: tuple[ClaimRequest, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[Mapping[str, Any], ...]
    allocation: Allocation | None
    reserved_for: tuple[str, ...]
    """UIDs of the consumers"""
    owner_uid: str
    """UID of the controlling owner (the pod of a claim made from a template)"""
    deleting: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    meta = obj.get("metadata") or {}
    devices = (obj.get("spec") or {}).get("devices") or {}
    status = obj.get("status") or {}
    requests = []
    for raw in devices.get("requests") or ():
        name = str(raw.get("name", ""))
        if raw.get("firstAvailable"):
            alternatives = tuple(
                _request(f"{name}/{sub.get('name', '')}", sub) for sub in raw["firstAvailable"]
            )
        else:
            alternatives = (_request(name, raw.get("exactly") or {}),)
        requests.append(ClaimRequest(name, alternatives))
    constraints = tuple(
        Constraint(tuple(str(r) for r in c.get("requests") or ()), str(c["matchAttribute"]))
        for c in devices.get("constraints") or ()
        if c.get("matchAttribute")
    )
    owner: Mapping[str, Any] = next(
        (o for o in meta.get("ownerReferences") or () if o.get("controller")), {}
    )
    return Claim(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        requests=tuple(requests),
        constraints=constraints,
        config=tuple(devices.get("config") or ()),
        allocation=parse_allocation(status.get("allocation")),
        reserved_for=tuple(str(r.get("uid", "")) for r in status.get("reservedFor") or ()),
        owner_uid=str(owner.get("uid", "")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(entry name, claim name) of each `spec.resourceClaims` entry: the claim named, or the
    one made from the template (`status.resourceClaimStatuses`; None while not made yet)."""
    made = {
        str(s.get("name", "")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    out: list[tuple[str, str | None]] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            out.append((name, str(entry["resourceClaimName"])))
        elif name in made:
            # a template claim the controller decided not to make is None: nothing to do
            out.append((name, str(made[name]) if made[name] else ""))
        else:
            out.append((name, None))
    return out


def uses_claim(pod: Mapping[str, Any], claim: Claim) -> bool:
    """Whether the pod uses `claim`: names it, or owns it (made from one of its templates,
    before the pod's status names it)."""
    meta = pod.get("metadata") or {}
    if meta.get("namespace", "default") != claim.namespace:
        return False
    return claim.owner_uid == meta.get("uid") or any(
        name == claim.name for _, name in pod_claim_names(pod)
    )


def allocation_to_api(
    node: str, results: Sequence[Result], config: Sequence[Mapping[str, Any]], timestamp: str
) -> dict[str, Any]:
    """`status.allocation` as kube-scheduler writes it for node-local devices."""
    devices: dict[str, Any] = {"results": [r.to_api() for r in results]}
    if config:
        devices["config"] = list(config)
    return {
        "devices": devices,
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
        "allocationTimestamp": timestamp,
    }
