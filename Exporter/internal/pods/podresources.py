"""Which containers use which DRA ResourceClaims: the kubelet's PodResources API (List).

In DRA mode the Runtime holds one allocation per ResourceClaim, not per container;
the kubelet knows which containers of which pods use a claim
(`ContainerResources.dynamic_resources`: claim name and namespace).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as pb
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2_grpc as pbgrpc

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

ClaimKey = tuple[str, str]
"""(claim namespace, claim name)."""


@dataclass(frozen=True, order=True)
class ClaimUser:
    """One container that uses a claim."""

    pod_namespace: str
    pod_name: str
    container: str


class PodResourcesError(Exception):
    """The PodResources API did not answer; the message says why."""


def claim_users(response: pb.ListPodResourcesResponse) -> dict[ClaimKey, tuple[ClaimUser, ...]]:
    """Every claim a ListPodResourcesResponse names, with the containers using it (sorted)."""
    users: dict[ClaimKey, set[ClaimUser]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                user = ClaimUser(pod.namespace, pod.name, container.name)
                users.setdefault((claim.claim_namespace, claim.claim_name), set()).add(user)
    return {key: tuple(sorted(found)) for key, found in users.items()}


class PodResourcesReader:
    """Reads the claim users from the kubelet's PodResources socket, one List per call."""

    def __init__(self, socket_path: str | Path, timeout_s: float) -> None:
        self.socket_path = str(socket_path)
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None

    async def claim_users(self) -> dict[ClaimKey, tuple[ClaimUser, ...]]:
        """The containers of the node's pods using each claim; PodResourcesError."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket_path}")
        stub = pbgrpc.PodResourcesListerStub(self._channel)
        try:
            response = await stub.List(pb.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            await self.close()  # a fresh channel next time, without gRPC's reconnect back-off
            raise PodResourcesError(
                f"PodResources List on {self.socket_path}: {exc.code().name}: {exc.details()}"
            ) from None
        return claim_users(response)

    async def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
