"""A ResourceClaim as NodePrepareResources sees it: read by namespace/name, checked against
the UID the kubelet asked for, and its allocation results of our driver read back as the
Runtime's device shares.

Every refusal is a ClaimError whose message is what the kubelet shows on the pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.naming import ShareError, resolve, share_of
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import KubeClient, KubeObject, NotFoundError
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.proto.pkg.runtimeclient import WHOLE_PERCENT, normalize

API = "/apis/resource.k8s.io/v1"


class ClaimError(Exception):
    """A claim that cannot be prepared on this node; the message says why."""


@dataclass(frozen=True)
class ClaimRef:
    """The claim the kubelet names: namespace, name and UID."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (UID {self.uid})"


@dataclass(frozen=True)
class ClaimDevice:
    """One allocation result of our driver: what the kubelet gets back, and the share the
    Runtime holds for it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    share: DeviceShare
    share_id: str = ""
    """The allocation's `shareID` (a share of a device that allows multiple allocations)."""


def claim_path(namespace: str, name: str) -> str:
    """The API path of a ResourceClaim."""
    return f"{API}/namespaces/{namespace}/resourceclaims/{name}"


def read_claim(kube: KubeClient, ref: ClaimRef) -> KubeObject:
    """The claim the kubelet names (blocking); ClaimError when it is gone or is another
    claim of the same name (stale: the kubelet holds an older UID)."""
    try:
        claim = kube.request("GET", claim_path(ref.namespace, ref.name))
    except NotFoundError as exc:
        raise ClaimError(f"{ref} not found on the API server") from exc
    uid = claim.get("metadata", {}).get("uid", "")
    if uid != ref.uid:
        raise ClaimError(f"{ref} is stale: the API server's claim of that name has UID {uid}")
    return claim


def claim_devices(
    claim: KubeObject,
    ref: ClaimRef,
    driver: str,
    pool: str,
    inventory: Sequence[pb.Device],
) -> tuple[ClaimDevice, ...]:
    """The claim's allocation results of `driver`, resolved against the Runtime's
    inventory. Refuses a claim without allocation, a result with admin access, a result in
    another pool (another node's devices), a device the inventory does not have, and
    capacity the device does not allow."""
    allocation = claim.get("status", {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{ref} is not allocated (status.allocation is empty)")
    results: list[Mapping[str, Any]] = allocation.get("devices", {}).get("results") or []
    out: list[ClaimDevice] = []
    for result in results:
        if result.get("driver") != driver:
            continue
        name = str(result.get("device", ""))
        result_pool = str(result.get("pool", ""))
        if result.get("adminAccess"):
            # The scheduler does not count an admin-access result as the device's use, and
            # the Runtime holds a device for its allocations only: it would take the device
            # from (or be refused beside) the claim the scheduler counts.
            raise ClaimError(
                f"{ref}: device {name} is allocated with admin access, which this driver does"
                " not serve (the Runtime injects a device only with an allocation)"
            )
        if result_pool != pool:
            raise ClaimError(
                f"{ref}: device {name} is in pool {result_pool}, not this node's pool {pool}"
            )
        ref_device = resolve(inventory, name)
        if ref_device is None:
            raise ClaimError(f"{ref}: device {name} is not in the Runtime's inventory")
        try:
            share = share_of(ref_device, result.get("consumedCapacity"))
        except ShareError as exc:
            raise ClaimError(f"{ref}: {exc}") from exc
        out.append(
            ClaimDevice(
                (str(result.get("request", "")),),
                result_pool,
                name,
                share,
                str(result.get("shareID") or ""),
            )
        )
    return tuple(out)


def merged_shares(ref: ClaimRef, devices: Sequence[ClaimDevice]) -> tuple[DeviceShare, ...]:
    """One share per Runtime device (the Runtime takes each device once per holder): shares
    of one device add up; ClaimError when they add past the device."""
    by_id: dict[str, list[ClaimDevice]] = {}
    for device in devices:
        by_id.setdefault(device.share.device_id, []).append(device)
    out: list[DeviceShare] = []
    for device_id, parts in by_id.items():
        if len(parts) == 1:
            out.append(parts[0].share)
            continue
        names = ", ".join(p.device for p in parts)
        if any(p.share.whole for p in parts):
            raise ClaimError(f"{ref}: results {names} take device {device_id} more than whole")
        cores = sum(p.share.core_percent for p in parts)
        memory = sum(p.share.memory_percent for p in parts)
        if cores > WHOLE_PERCENT or memory > WHOLE_PERCENT:
            raise ClaimError(
                f"{ref}: results {names} add up to {cores} % cores and {memory} % memory"
                f" of device {device_id}, more than the device has"
            )
        out.append(normalize(DeviceShare(device_id, cores, memory)))
    return tuple(out)
