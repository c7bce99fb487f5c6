"""The kubelet plugin's gRPC servers: DRAPlugin (v1 and v1beta1, one handler) and, when given,
DRAResourceHealth (health.py) on the service socket `<kubelet dir>/plugins/<driver>/dra.sock`,
and plugin Registration on
`<kubelet dir>/plugins_registry/<driver>-reg.sock`, which the kubelet watches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import grpc

from lj_runtimekit.deviceplugin.internal.dra.checkpoint import PreparedClaim
from lj_runtimekit.deviceplugin.internal.dra.claims import ClaimRef
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2 as v1
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2_grpc as v1_grpc
from lj_runtimekit.proto.k8s.dra.v1beta1 import api_pb2 as v1beta1
from lj_runtimekit.proto.k8s.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from lj_runtimekit.proto.k8s.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2 as reg
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""The kubelet's names of the DRAPlugin gRPC services served, newest first."""
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
"""Registered beside them when the health API is served: kubelets from 1.36 on open the
health stream only for a plugin that names it (earlier ones ignore the name and try)."""
SERVICE_SOCKET = "dra.sock"
_MAX_SOCKET_PATH = 107

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class ServerError(Exception):
    """A socket cannot be served; the message names it."""


class Claims(Protocol):
    """What the DRAPlugin servicers delegate to (the Preparer)."""

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Each claim's devices, or its error."""

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Each claim's error ("" when done)."""


def service_socket(kubelet_dir: Path, driver: str) -> Path:
    """The DRAPlugin socket the kubelet dials."""
    return kubelet_dir / "plugins" / driver / SERVICE_SOCKET


def registration_socket(kubelet_dir: Path, driver: str) -> Path:
    """The registration socket the kubelet's plugin watcher finds."""
    return kubelet_dir / "plugins_registry" / f"{driver}-reg.sock"


def _refs(claims: Sequence[v1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class DraPluginServicer(v1_grpc.DRAPluginServicer):
    """DRAPlugin v1: every claim of a request gets an entry, its devices or its error."""

    def __init__(self, claims: Claims) -> None:
        self._claims = claims

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: Context
    ) -> v1.NodePrepareResourcesResponse:
        """Prepare each claim (once; repeated calls answer the same). A call the kubelet
        gives up on still finishes: its claims end prepared and recorded, or not held."""
        outcomes = await asyncio.shield(self._claims.prepare(_refs(request.claims)))
        response = v1.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if isinstance(outcome, str):
                entry.error = outcome
                continue
            entry.devices.extend(
                v1.Device(
                    request_names=list(d.request_names),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=[outcome.cdi_device_id],
                    share_id=d.share_id or None,
                )
                for d in outcome.devices
            )
        return response

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1.NodeUnprepareResourcesResponse:
        """Release each claim (an unknown one too); finishes like NodePrepareResources."""
        outcomes = await asyncio.shield(self._claims.unprepare(_refs(request.claims)))
        response = v1.NodeUnprepareResourcesResponse()
        for uid, error in outcomes.items():
            response.claims[uid].error = error
        return response


class DraPluginV1Beta1Servicer(v1beta1_grpc.DRAPluginServicer):
    """DRAPlugin v1beta1: the same messages on the wire, served by the v1 handler."""

    def __init__(self, v1_servicer: DraPluginServicer) -> None:
        self._v1 = v1_servicer

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: Context
    ) -> v1beta1.NodePrepareResourcesResponse:
        """See DraPluginServicer."""
        asked = v1.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self._v1.NodePrepareResources(asked, context)
        return v1beta1.NodePrepareResourcesResponse.FromString(answer.SerializeToString())

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: Context
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        """See DraPluginServicer."""
        asked = v1.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self._v1.NodeUnprepareResources(asked, context)
        return v1beta1.NodeUnprepareResourcesResponse.FromString(answer.SerializeToString())


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks: who we are and where to dial."""

    def __init__(self, driver: str, endpoint: Path, services: Sequence[str]) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._services = list(services)
        self.registered: bool | None = None
        """The kubelet's last verdict (None before it gave one)."""

    async def GetInfo(self, request: reg.InfoRequest, context: Context) -> reg.PluginInfo:
        """A DRA plugin of our driver on the service socket."""
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint),
            supported_versions=self._services,
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Context
    ) -> reg.RegistrationStatusResponse:
        """Log the kubelet's verdict; a refusal names its reason."""
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("registered with the kubelet", extra={"driver": self._driver})
        else:
            log.error(
                "the kubelet refused the registration",
                extra={"driver": self._driver, "reason": request.error},
            )
        return reg.RegistrationStatusResponse()


def _bind(server: grpc.aio.Server, path: Path) -> None:
    """Listen on the unix socket `path`, replacing a stale socket file."""
    if len(str(path).encode()) > _MAX_SOCKET_PATH:
        raise ServerError(f"socket path {path} is longer than {_MAX_SOCKET_PATH} bytes")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{path}")
    except (OSError, RuntimeError) as exc:
        raise ServerError(f"cannot listen on {path}: {exc}") from exc


class PluginServers:
    """Both servers: the service socket first, then the registration socket (the kubelet
    dials the service as soon as it sees the registration)."""

    def __init__(
        self,
        kubelet_dir: Path,
        driver: str,
        claims: Claims,
        health: health_grpc.DRAResourceHealthServicer | None = None,
    ) -> None:
        self.service_path = service_socket(kubelet_dir, driver)
        self.registration_path = registration_socket(kubelet_dir, driver)
        services = (*SUPPORTED_SERVICES, *((HEALTH_SERVICE,) if health is not None else ()))
        self.registration = RegistrationServicer(driver, self.service_path, services)
        self._claims = claims
        self._health = health
        self._servers: list[tuple[grpc.aio.Server, Path]] = []

    async def start(self) -> None:
        """Serve both sockets (stale files replaced); ServerError when one cannot be."""
        service = grpc.aio.server()
        servicer = DraPluginServicer(self._claims)
        v1_grpc.add_DRAPluginServicer_to_server(servicer, service)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraPluginV1Beta1Servicer(servicer), service)
        if self._health is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(self._health, service)
        registration = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self.registration, registration)
        try:
            for server, path in (
                (service, self.service_path),
                (registration, self.registration_path),
            ):
                _bind(server, path)
                await server.start()
                self._servers.append((server, path))
        except ServerError:
            await self.stop(0)
            raise
        log.info(
            "serving",
            extra={"service": self.service_path, "registration": self.registration_path},
        )

    async def stop(self, grace: float | None) -> None:
        """Stop serving (registration first) and remove the sockets."""
        while self._servers:
            server, path = self._servers.pop()
            await server.stop(grace)
            path.unlink(missing_ok=True)
