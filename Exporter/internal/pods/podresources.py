"""Which containers use which DRA ResourceClaims: the kubelet's PodResources API (List).

In DRA mode the Runtime holds one allocation per ResourceClaim, not per container;
the kubelet knows which containers of which pods use a claim
(`ContainerResources.dynamic_resources`: claim name and namespace). The vendored
PodResources proto (proto/k8s/podresources/v1) leaves DynamicResource out, so the
messages read here are built at import from their upstream field numbers
(k8s.io/kubelet/pkg/apis/podresources/v1), only the fields read: the wire format is the
kubelet's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"

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


def _messages() -> Mapping[str, Any]:
    field = descriptor_pb2.FieldDescriptorProto
    text, nested = field.TYPE_STRING, field.TYPE_MESSAGE
    file = descriptor_pb2.FileDescriptorProto(
        name="lj_exporter_podresources_dra.proto", package="v1", syntax="proto3"
    )
    fields: dict[str, tuple[tuple[str, int, int, str], ...]] = {
        "ListPodResourcesRequest": (),
        "DynamicResource": (("claim_name", 2, text, ""), ("claim_namespace", 3, text, "")),
        "ContainerResources": (
            ("name", 1, text, ""),
            ("dynamic_resources", 5, nested, "DynamicResource"),
        ),
        "PodResources": (
            ("name", 1, text, ""),
            ("namespace", 2, text, ""),
            ("containers", 3, nested, "ContainerResources"),
        ),
        "ListPodResourcesResponse": (("pod_resources", 1, nested, "PodResources"),),
    }
    for name, members in fields.items():
        message = file.message_type.add(name=name)
        for member, number, kind, type_name in members:
            repeated = kind == nested
            label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            added = message.field.add(name=member, number=number, type=kind, label=label)
            if type_name:
                added.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in fields
    }


MESSAGES = _messages()
"""The message classes by name (ListPodResourcesRequest, ListPodResourcesResponse, ...)."""


def claim_users(response: Any) -> dict[ClaimKey, tuple[ClaimUser, ...]]:
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
        call: grpc.aio.UnaryUnaryMultiCallable[Any, Any] = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=MESSAGES["ListPodResourcesResponse"].FromString,
        )
        try:
            response = await call(MESSAGES["ListPodResourcesRequest"](), timeout=self._timeout_s)
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
