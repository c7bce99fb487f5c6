"""Composition of the simulator: the Runtime and admin servers on their unix sockets."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from lj_runtimekit.controller.pkg.configpb import config_service_pb2_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2_grpc
from lj_runtimekit.proto.lingjun.runtimesim.v1 import admin_pb2_grpc
from lj_runtimekit.runtimesim.admin import SimulatorAdmin
from lj_runtimekit.runtimesim.allocation import Allocator
from lj_runtimekit.runtimesim.faults import FaultInterceptor, Faults
from lj_runtimekit.runtimesim.inventory import build_inventory
from lj_runtimekit.runtimesim.metrics import MetricsModel
from lj_runtimekit.runtimesim.node import NodeSpec
from lj_runtimekit.runtimesim.services import (
    AllocationService,
    DeviceService,
    MetricsService,
    NodeFeatureService,
    RuntimeService,
)
from lj_runtimekit.runtimesim.state import NodeState

log = logging.getLogger(__name__)

RUNTIME_SOCKET = "runtime.sock"
ADMIN_SOCKET = "sim-admin.sock"
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL


class SimulatorError(Exception):
    """The simulator cannot start (socket directory unusable, path too long, bind failed)."""


class RuntimeEndpoint:
    """The Runtime gRPC server on its socket; it can be taken down and served again."""

    def __init__(self, path: Path, simulator: Simulator) -> None:
        self.path = path
        self._simulator = simulator
        self._server: grpc.aio.Server | None = None
        self._pending: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve the Runtime contract on the socket (a stale socket file is replaced)."""
        sim = self._simulator
        server = grpc.aio.server(interceptors=[FaultInterceptor(sim.faults)])
        runtime_pb2_grpc.add_RuntimeServiceServicer_to_server(RuntimeService(sim.state), server)
        runtime_pb2_grpc.add_DeviceServiceServicer_to_server(DeviceService(sim.state), server)
        runtime_pb2_grpc.add_AllocationServiceServicer_to_server(
            AllocationService(sim.allocator), server
        )
        config_service_pb2_grpc.add_NodeFeatureServiceServicer_to_server(
            NodeFeatureService(sim.state), server
        )
        runtime_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(sim.metrics), server)
        self._server = await _serve(server, self.path)
        log.info("runtime serving socket=%s node=%s", self.path, sim.state.node_name)

    async def stop(self, grace: float | None) -> None:
        """Stop serving (ending open streams after ``grace`` seconds) and remove the socket."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
            log.info("runtime stopped socket=%s", self.path)
        self.path.unlink(missing_ok=True)

    async def restart(self, down_ms: int) -> None:
        """Close the socket now and serve it again after ``down_ms`` milliseconds."""
        await self.cancel_restart()
        await self.stop(None)
        log.info("runtime socket down socket=%s down_ms=%d", self.path, down_ms)
        self._pending = asyncio.create_task(self._serve_later(down_ms / 1000))

    async def cancel_restart(self) -> None:
        """Drop a pending restart, if any."""
        if self._pending is not None:
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)
            self._pending = None

    async def _serve_later(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self.start()


class Simulator:
    """A simulated Runtime: node state, its servicers, and both sockets."""

    def __init__(
        self,
        node: NodeSpec,
        socket_dir: Path,
        version: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.node = node
        self.socket_dir = socket_dir
        self.seed = node.seed if seed is None else seed
        self.state = NodeState(node, build_inventory(node), version or node.runtime_version)
        self.allocator = Allocator(self.state)
        self.metrics = MetricsModel(self.seed, self.state, self.allocator)
        self.faults = Faults(self.seed)
        self.runtime = RuntimeEndpoint(socket_dir / RUNTIME_SOCKET, self)
        self.admin_path = socket_dir / ADMIN_SOCKET
        self._admin: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Create the socket directory and serve the Runtime and the admin interface."""
        for path in (self.runtime.path, self.admin_path):
            if len(str(path).encode()) > _MAX_SOCKET_PATH:
                raise SimulatorError(f"socket path {path} is longer than {_MAX_SOCKET_PATH} bytes")
        try:
            self.socket_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SimulatorError(
                f"cannot create socket directory {self.socket_dir}: {exc}"
            ) from exc
        await self.runtime.start()
        admin = grpc.aio.server()
        admin_pb2_grpc.add_SimulatorAdminServicer_to_server(
            SimulatorAdmin(self.state, self.faults, self.runtime.restart), admin
        )
        try:
            self._admin = await _serve(admin, self.admin_path)
        except SimulatorError:
            await self.runtime.stop(None)
            raise
        log.info("admin serving socket=%s", self.admin_path)

    async def stop(self, grace: float) -> None:
        """Stop both servers with a grace period and remove the sockets."""
        await self.runtime.cancel_restart()
        await self.runtime.stop(grace)
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await admin.stop(grace)
        self.admin_path.unlink(missing_ok=True)
        log.info("simulator stopped node=%s", self.node.name)


async def _serve(server: grpc.aio.Server, path: Path) -> grpc.aio.Server:
    _bind(server, path)
    await server.start()
    return server


def _bind(server: grpc.aio.Server, path: Path) -> None:
    """Listen on the unix socket ``path``, replacing a stale socket file."""
    path.unlink(missing_ok=True)
    try:
        server.add_insecure_port(f"unix:{path}")
    except RuntimeError as exc:
        raise SimulatorError(f"cannot listen on {path}: {exc}") from exc


async def run(simulator: Simulator, stop: asyncio.Event, grace: float) -> None:
    """Serve until ``stop`` is set, then stop gracefully."""
    await simulator.start()
    log.info(
        "simulator ready node=%s devices=%d version=%s",
        simulator.node.name,
        len(simulator.state.devices),
        simulator.state.version,
    )
    try:
        await stop.wait()
    finally:
        await simulator.stop(grace)
