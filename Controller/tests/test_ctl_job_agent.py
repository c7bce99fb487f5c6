"""lj-job-agent as a subprocess against the Runtime simulator subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from lj_runtimekit.controller.pkg.configpb import config_service_pb2, config_service_pb2_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

NODE = EXAMPLE_NODES / "tdm-8gpu.yaml"
AGENT = [sys.executable, "-m", "lj_runtimekit.controller.cmd.job_agent.main"]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    yield path / "s"
    shutil.rmtree(path, ignore_errors=True)


def agent(
    socket_dir: Path, action: str, *extra: str, timeout: float = 60
) -> tuple[int, str, str, float]:
    """Run the agent; (exit code, termination message, stderr, seconds)."""
    log = socket_dir.parent / "termination-log"
    log.unlink(missing_ok=True)
    began = time.monotonic()
    done = subprocess.run(
        [
            *AGENT,
            action,
            f"--socket-dir={socket_dir}",
            f"--termination-log={log}",
            "--requester=kube-system/test-job",
            "--log-format=text",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    message = log.read_text() if log.exists() else ""
    return done.returncode, message, done.stderr, time.monotonic() - began


def feature_state(sim: SimulatorProcess) -> config_service_pb2.FeatureState:
    with grpc.insecure_channel(sim.runtime_target) as channel:
        stub = config_service_pb2_grpc.NodeFeatureServiceStub(channel)
        state: config_service_pb2.FeatureState = stub.GetFeatureState(
            config_service_pb2.GetFeatureStateRequest(), timeout=5
        )
        return state


def test_enable_disable_and_repeat_are_idempotent(socket_dir: Path) -> None:
    with SimulatorProcess(socket_dir, NODE) as sim:
        code, message, stderr, _ = agent(socket_dir, "enable")
        assert code == 0, stderr
        assert message.count("\n") == 1
        assert message.startswith("enable ok: features switched")
        state = feature_state(sim)
        assert state.enabled
        assert state.changed_by == "kube-system/test-job"

        code, message, _, _ = agent(socket_dir, "enable")
        assert code == 0
        assert message.startswith("enable ok: features already enabled")
        assert feature_state(sim).enabled

        code, message, _, _ = agent(socket_dir, "disable")
        assert code == 0
        assert message.startswith("disable ok: features switched disabled")
        assert not feature_state(sim).enabled

        code, message, _, _ = agent(socket_dir, "disable")
        assert (code, message.split(":")[0]) == (0, "disable ok")
        assert "already disabled" in message
        assert not feature_state(sim).enabled


def test_state_reads_the_switch_and_writes_no_termination_message(socket_dir: Path) -> None:
    with SimulatorProcess(socket_dir, NODE) as sim:
        code, message, stderr, _ = agent(socket_dir, "state")
        assert (code, message) == (0, ""), stderr
        assert "state ok: features disabled on node tdm-8gpu" in stderr
        assert agent(socket_dir, "enable")[0] == 0
        done = subprocess.run(
            [*AGENT, "state", f"--socket-dir={socket_dir}", "--log-format=text"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        state = json.loads(done.stdout)
        assert state["enabled"] is True
        assert state["changedBy"] == "kube-system/test-job"
        assert "changed" not in state
        assert feature_state(sim).changed_by == "kube-system/test-job"


def test_runtime_absent_bounded_retries_then_exit_3(socket_dir: Path) -> None:
    socket_dir.mkdir(parents=True)
    code, message, stderr, took = agent(
        socket_dir, "enable", "--retry-timeout=2", "--retry-attempts=4", "--call-timeout=1"
    )
    assert code == 3, stderr
    assert message.startswith("enable failed: Runtime not reachable on socket")
    assert str(socket_dir / "runtime.sock") in message
    assert "does not exist" in message
    assert took < 20
    assert "Traceback" not in stderr


def test_runtime_appearing_during_retries_is_used(socket_dir: Path) -> None:
    socket_dir.mkdir(parents=True)
    log = socket_dir.parent / "termination-log"
    with subprocess.Popen(
        [
            *AGENT,
            "enable",
            f"--socket-dir={socket_dir}",
            f"--termination-log={log}",
            "--retry-timeout=30",
            "--retry-attempts=30",
        ],
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            with SimulatorProcess(socket_dir, NODE) as sim:
                _, stderr = proc.communicate(timeout=30)
                assert proc.returncode == 0, stderr
                assert feature_state(sim).enabled
        finally:
            if proc.poll() is None:
                proc.kill()
    assert log.read_text().startswith("enable ok")


def test_runtime_below_1_13_is_refused_with_exit_4(socket_dir: Path) -> None:
    with SimulatorProcess(socket_dir, NODE, version="v1.12.3") as sim:
        code, message, stderr, _ = agent(socket_dir, "enable")
        assert code == 4, stderr
        assert message.startswith("enable refused: Runtime v1.12.3 is too old")
        assert "v1.13.0" in message
        assert not feature_state(sim).enabled


class RefusingRuntime(
    runtime_pb2_grpc.RuntimeServiceServicer, config_service_pb2_grpc.NodeFeatureServiceServicer
):
    """A Runtime that answers its version but refuses the feature switch."""

    def GetRuntimeInfo(
        self, request: object, context: grpc.ServicerContext
    ) -> runtime_pb2.RuntimeInfo:
        return runtime_pb2.RuntimeInfo(version="v1.15.0", node_name="gpu-7", api_version="v1")

    def EnableFeatures(
        self, request: object, context: grpc.ServicerContext
    ) -> config_service_pb2.FeatureState:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "node is draining")
        raise AssertionError("unreachable")

    def DisableFeatures(
        self, request: object, context: grpc.ServicerContext
    ) -> config_service_pb2.FeatureState:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "node is draining")
        raise AssertionError("unreachable")

    def GetFeatureState(
        self, request: object, context: grpc.ServicerContext
    ) -> config_service_pb2.FeatureState:
        return config_service_pb2.FeatureState(enabled=False)


def test_runtime_refusing_gives_exit_5(socket_dir: Path) -> None:
    socket_dir.mkdir(parents=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = RefusingRuntime()
    runtime_pb2_grpc.add_RuntimeServiceServicer_to_server(servicer, server)
    config_service_pb2_grpc.add_NodeFeatureServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{socket_dir / 'runtime.sock'}")
    server.start()
    try:
        code, message, stderr, _ = agent(socket_dir, "enable")
    finally:
        server.stop(0)
    assert code == 5, stderr
    assert message.startswith("enable failed: Runtime EnableFeatures failed: FAILED_PRECONDITION")
    assert "node is draining" in message


def test_transient_runtime_errors_are_retried(socket_dir: Path) -> None:
    with SimulatorProcess(socket_dir, NODE, seed=7) as sim:
        sim.set_error_rate(0.5)
        code, message, stderr, _ = agent(socket_dir, "enable", "--retry-attempts=20")
        assert code == 0, stderr
        sim.set_error_rate(0.0)
        assert feature_state(sim).enabled
    assert message.startswith("enable ok")


def test_usage_errors_exit_2(socket_dir: Path) -> None:
    code, _, stderr, _ = agent(socket_dir, "toggle")
    assert code == 2
    assert "invalid choice: 'toggle'" in stderr
    code, _, stderr, _ = agent(socket_dir, "enable", "--retry-attempts=0")
    assert code == 2
    assert "--retry-attempts must be >= 1" in stderr
