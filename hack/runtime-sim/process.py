"""Test helper: run `lj-runtime-sim` as a subprocess and drive its admin interface.

Usage::

    with SimulatorProcess(tmp_path / "sock", EXAMPLE_NODES / "tdm-8gpu.yaml") as sim:
        channel = grpc.aio.insecure_channel(sim.runtime_target)
        sim.set_health(device_id, healthy=False, reason="XID 79")
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import grpc

from lj_runtimekit.proto.lingjun.runtimesim.v1 import admin_pb2, admin_pb2_grpc
from lj_runtimekit.runtimesim.server import ADMIN_SOCKET, RUNTIME_SOCKET

EXAMPLE_NODES = Path(__file__).resolve().parent / "examples" / "nodes"
"""Directory of the example node files (shipped with the package)."""

_FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 200),
]
_POLL_S = 0.1


class SimulatorStartError(RuntimeError):
    """The simulator exited or did not answer in time; the message holds its log."""


class SimulatorProcess:
    """A `lj-runtime-sim` subprocess serving ``socket_dir`` from ``node_file``.

    A context manager: entering starts it and waits until both sockets answer,
    leaving stops it with SIGTERM (SIGKILL after ``stop_timeout``). The log goes
    to ``log_path`` (default ``<socket_dir>/../<socket_dir name>.log``).
    """

    def __init__(
        self,
        socket_dir: Path,
        node_file: Path,
        *,
        version: str | None = None,
        seed: int | None = None,
        start_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.socket_dir = socket_dir
        self.node_file = node_file
        self.runtime_socket = socket_dir / RUNTIME_SOCKET
        self.admin_socket = socket_dir / ADMIN_SOCKET
        self.log_path = log_path or socket_dir.with_name(socket_dir.name + ".log")
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._args = [
            sys.executable,
            "-m",
            "lj_runtimekit.runtimesim.cli",
            "--node",
            str(node_file),
            "--socket-dir",
            str(socket_dir),
            *(("--version", version) if version else ()),
            *(("--seed", str(seed)) if seed is not None else ()),
            *extra_args,
        ]
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._admin_channel: grpc.Channel | None = None
        self._admin: admin_pb2_grpc.SimulatorAdminStub | None = None

    @property
    def runtime_target(self) -> str:
        """gRPC target of the Runtime socket (``unix:<path>``)."""
        return f"unix:{self.runtime_socket}"

    @property
    def admin_target(self) -> str:
        """gRPC target of the admin socket."""
        return f"unix:{self.admin_socket}"

    @property
    def pid(self) -> int:
        """Process id of the running simulator."""
        return self._process().pid

    def log(self) -> str:
        """The simulator's log so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def start(self) -> None:
        """Start the process and wait until both sockets answer."""
        if self._proc is not None:
            raise RuntimeError("simulator already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(self._args, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self.wait_ready(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self._admin_channel = grpc.insecure_channel(self.admin_target)
        self._admin = admin_pb2_grpc.SimulatorAdminStub(self._admin_channel)

    def wait_ready(self, timeout: float) -> None:
        """Wait until the Runtime and admin sockets accept connections."""
        deadline = time.monotonic() + timeout
        for target in (self.runtime_target, self.admin_target):
            self._wait_channel(target, deadline)

    def _wait_channel(self, target: str, deadline: float) -> None:
        with grpc.insecure_channel(target, options=_FAST_RECONNECT) as channel:
            ready = grpc.channel_ready_future(channel)
            while True:
                try:
                    ready.result(timeout=_POLL_S)
                    return
                except grpc.FutureTimeoutError:
                    pass
                code = self._process().poll()
                if code is not None:
                    raise SimulatorStartError(
                        f"lj-runtime-sim exited with {code}:\n{self.log()}"
                    ) from None
                if time.monotonic() > deadline:
                    ready.cancel()
                    raise SimulatorStartError(f"{target} did not answer in time:\n{self.log()}")

    def stop(self) -> int:
        """Stop the process (SIGTERM, then SIGKILL); return its exit status."""
        if self._admin_channel is not None:
            self._admin_channel.close()
            self._admin_channel = self._admin = None
        proc = self._process()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def __enter__(self) -> SimulatorProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _process(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("simulator not started")
        return self._proc

    def _stub(self) -> admin_pb2_grpc.SimulatorAdminStub:
        if self._admin is None:
            raise RuntimeError("simulator not running")
        return self._admin

    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> str:
        """Mark a device or MIG instance healthy or unhealthy."""
        request = admin_pb2.SetDeviceHealthRequest(
            device_id=device_id, healthy=healthy, reason=reason
        )
        return self._stub().SetDeviceHealth(request).message

    def restart_socket(self, down_ms: int = 200, *, wait: bool = True) -> str:
        """Close the Runtime socket for ``down_ms``; with ``wait``, until it answers again."""
        message = self._stub().RestartSocket(admin_pb2.RestartSocketRequest(down_ms=down_ms))
        if wait:
            self._wait_channel(self.runtime_target, time.monotonic() + self.start_timeout)
        return message.message

    def set_latency(self, latency_ms: int) -> str:
        """Add ``latency_ms`` to every Runtime RPC (0 turns it off)."""
        return self._stub().SetLatency(admin_pb2.SetLatencyRequest(latency_ms=latency_ms)).message

    def set_error_rate(self, error_rate: float) -> str:
        """Fail this share (0..1) of Runtime RPCs with UNAVAILABLE."""
        request = admin_pb2.SetErrorRateRequest(error_rate=error_rate)
        return self._stub().SetErrorRate(request).message

    def fail_allocations(self, skip: int, count: int) -> str:
        """Serve the next `skip` Allocate calls, then fail `count` (INTERNAL)."""
        request = admin_pb2.FailAllocationsRequest(skip=skip, count=count)
        return self._stub().FailAllocations(request).message

    def set_version(self, version: str) -> str:
        """Change the Runtime version reported from now on."""
        return self._stub().SetVersion(admin_pb2.SetVersionRequest(version=version)).message
