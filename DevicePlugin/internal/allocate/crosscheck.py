"""The kubelet's PodResources record, read for the pod in admission and checked against the
ledger (the comparison itself: `podresources.check.compare`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc

from lj_runtimekit.deviceplugin.internal.allocate.ledger import Ledger
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import PodInfo
from lj_runtimekit.deviceplugin.internal.podresources.check import (
    Difference,
    PodResourcesClient,
    compare,
)
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.pkg.protocol import Protocol

log = logging.getLogger(__name__)


class CrossCheck:
    """Reads the kubelet's PodResources `List` and compares it with the ledger."""

    def __init__(
        self,
        client: PodResourcesClient | None,
        ledger: Ledger,
        rm: ResourceManager,
        protocol: Protocol,
    ) -> None:
        self._client = client
        self._ledger = ledger
        self._rm = rm
        self._protocol = protocol
        self.differences: list[Difference] = []
        """The last cross-check's differences between the kubelet's record and the ledger."""
        self._reported: set[tuple[str, str, str]] = set()
        self._seen_last: set[tuple[str, str, str]] = set()
        """The differences of the cross-check before the last (see `run`)."""

    async def read(self) -> prpb.ListPodResourcesResponse | None:
        """The kubelet's PodResources `List`; None without the socket or when it fails."""
        client = self._client
        if client is None or not client.available:
            return None
        try:
            return await client.list()
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "pod resources not read",
                extra={"socket": client.socket_path, "reason": exc.details()},
            )
            return None

    async def kubelet_active(self) -> set[tuple[str, str]] | None:
        """(namespace, name) of the pods the kubelet holds active, the one it is admitting
        included; None without the socket or when it fails."""
        listed = await self.read()
        if listed is None:
            return None
        return {(p.namespace, p.name) for p in listed.pod_resources}

    async def run(self, pods: Sequence[PodInfo]) -> list[Difference]:
        """Compare the kubelet's record with the ledger; log each difference once when two
        rounds in a row show it (a difference means a device may be held by two pods; one
        round alone can fall between the kubelet's Allocate calls for one container's core
        and memory resources, which it records one by one)."""
        listed = await self.read()
        if listed is None:
            return []
        res = self._protocol.resources
        served = {(h.pod_uid, h.container): h.shares for h in self._ledger.entries.values()}
        self.differences = compare(
            listed,
            pods,
            served,
            self._rm.resources(),
            self._ledger.resource_of,
            res.core,
            res.memory,
        )
        keys = set()
        for diff in self.differences:
            key = (diff.pod, diff.container, diff.resource)
            keys.add(key)
            if key in self._seen_last and key not in self._reported:
                log.warning(
                    "kubelet record differs from the allocation", extra={"difference": diff}
                )
                self._reported.add(key)
        self._reported &= keys
        self._seen_last = keys
        return self.differences
