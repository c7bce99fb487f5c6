"""Cross-check of the kubelet's record (PodResources `List`) against what the plugin served.

The kubelet's device manager keeps its own record of the device IDs each
container got; the plugin's ledger holds what the Runtime allocated. The
admission protocol keeps them equal; this check shows it on a live node: for
every pod both know, per container and resource, the kubelet's IDs must be
the served devices (whole devices and MIG instances: the same IDs; slices:
units of the served slice's device, as many as its percentage). Each
difference is logged once per container and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from lj_runtimekit.deviceplugin.internal.podlookup.lookup import PodInfo
from lj_runtimekit.deviceplugin.internal.rm.resources import slice_unit_device
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2_grpc as prgrpc
from lj_runtimekit.proto.pkg.protocol import DeviceShare

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class Difference:
    """One container and resource on which the kubelet and the plugin disagree."""

    pod: str
    container: str
    resource: str
    kubelet: tuple[str, ...]
    served: str

    def __str__(self) -> str:
        shown = ", ".join(self.kubelet[:4]) + (" ..." if len(self.kubelet) > 4 else "")
        return (
            f"pod {self.pod} container {self.container} {self.resource}: the kubelet records"
            f" [{shown or 'nothing'}] ({len(self.kubelet)}), the plugin served {self.served}"
        )


def _expected(shares: Iterable[DeviceShare], resource: str, core: str, memory: str) -> str:
    """What the kubelet should record for `resource`, given the served shares (a text)."""
    for s in shares:
        if not s.whole and resource in (core, memory):
            pct = s.core_percent if resource == core else s.memory_percent
            return f"{pct} units of {s.device_id}"
    return ",".join(sorted(s.device_id for s in shares if s.whole))


def _recorded(ids: Iterable[str], resource: str, core: str, memory: str) -> str:
    """The kubelet's IDs in the same text form."""
    ids = list(ids)
    if resource in (core, memory):
        parents = sorted({slice_unit_device(i) or i for i in ids})
        return f"{len(ids)} units of {','.join(parents)}" if ids else "0 units of "
    return ",".join(sorted(ids))


def compare(
    listed: prpb.ListPodResourcesResponse,
    pods: Iterable[PodInfo],
    served: Mapping[tuple[str, str], tuple[DeviceShare, ...]],
    ours: Collection[str],
    resources_of: Callable[[DeviceShare], set[str]],
    core: str,
    memory: str,
) -> list[Difference]:
    """Differences between the kubelet's record and `served` ((pod uid, container) ->
    shares) for every active pod both know, on the resources in `ours`; `resources_of`
    maps a share to the resources it stands for."""
    by_ref = {(p.namespace, p.name): p for p in pods if p.active}
    out: list[Difference] = []
    for entry in listed.pod_resources:
        pod = by_ref.get((entry.namespace, entry.name))
        if pod is None:
            continue
        limits = {c.name: c.limits for c in pod.containers}
        for c in entry.containers:
            shares = served.get((pod.uid, c.name), ())
            kubelet: dict[str, list[str]] = {}
            # The kubelet lists one entry per device (each with its topology).
            for d in c.devices:
                if d.resource_name in ours:
                    kubelet.setdefault(d.resource_name, []).extend(d.device_ids)
            asked = limits.get(c.name, {})
            implied = {r for s in shares for r in resources_of(s) if asked.get(r, 0) > 0}
            for resource in sorted(kubelet.keys() | implied):
                mine = [s for s in shares if resource in resources_of(s)]
                expected = _expected(mine, resource, core, memory)
                recorded = _recorded(kubelet.get(resource, ()), resource, core, memory)
                if expected != recorded:
                    out.append(
                        Difference(
                            pod.ref,
                            c.name,
                            resource,
                            tuple(kubelet.get(resource, ())),
                            expected or "nothing",
                        )
                    )
    return out


class PodResourcesClient:
    """Reads the kubelet's PodResources `List` over its unix socket."""

    def __init__(self, socket_path: str, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s

    @property
    def available(self) -> bool:
        """Whether the kubelet's socket exists."""
        return Path(self.socket_path).exists()

    async def list(self) -> prpb.ListPodResourcesResponse:
        """Every pod's containers and device IDs, as the kubelet records them."""
        async with grpc.aio.insecure_channel(f"unix://{self.socket_path}") as channel:
            stub = prgrpc.PodResourcesListerStub(channel)
            response: prpb.ListPodResourcesResponse = await stub.List(
                prpb.ListPodResourcesRequest(), timeout=self._timeout_s
            )
            return response
