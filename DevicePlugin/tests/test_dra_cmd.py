"""`lj-dra-plugin` as a process: operator mistakes are one line and exit 1; on a node it
publishes the node's slices, registers, prepares claims, keeps them across a restart
(checkpoint) and gives them back to a Runtime that restarted under it, stops on SIGTERM
leaving its slices, and `--remove-slices` uninstalls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.dra.prepare import container_key
from lj_runtimekit.deviceplugin.internal.dra.server import registration_socket, service_socket
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2 as v1
from lj_runtimekit.proto.k8s.dra.v1 import api_pb2_grpc as v1_grpc
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2 as reg
from lj_runtimekit.proto.k8s.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2_grpc as pb_grpc
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeClient
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET
from lj_runtimekit.testkit.kubeconfig import unreachable_kubeconfig
from lj_runtimekit.testkit.waits import NotYet, wait_for

from . import test_dra_prepare as bed
from .test_dra_prepare import DRIVER, result, write_claim

# the control plane and namespace fixtures of the prepare tests, for this module
dra_cp, kube, ns = bed.dra_cp, bed.kube, bed.ns

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def plugin_argv(*args: str) -> list[str]:
    """The command line of the plugin."""
    return [sys.executable, "-m", "lj_runtimekit.deviceplugin.cmd.dra_plugin.main", *args]


def run_plugin(args: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the plugin to its end; its status and output."""
    environ = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBECONFIG")}
    done = subprocess.run(
        plugin_argv("--log-format=text", *args),
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def one_line_error(output: str) -> str:
    """The single `cannot start` line of a refused start."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "cannot start" in line]
    assert len(lines) == 1, output
    return lines[0]


def test_operator_mistakes_are_one_line(tmp_path: Path) -> None:
    status, out = run_plugin([])
    assert status == 1
    assert "the node name is missing: set --node-name or NODE_NAME" in one_line_error(out)

    bad = tmp_path / "protocol.yaml"
    bad.write_text('dra.driver: "Bad Name"\n')
    status, out = run_plugin(["--node-name=n1", f"--protocol-file={bad}"])
    assert status == 1
    assert f"{bad}: key 'dra.driver'" in one_line_error(out)

    kubeconfig = unreachable_kubeconfig(tmp_path)
    status, out = run_plugin([], env={"NODE_NAME": "n1", "KUBECONFIG": str(kubeconfig)})
    assert status == 1
    assert "API server https://127.0.0.1:1: node n1" in one_line_error(out)


class Plugin:
    """The plugin process on one node: its directories and its log."""

    def __init__(self, workdir: Path, kubeconfig: Path, node: str, runtime_dir: Path) -> None:
        self.kubelet_dir = workdir / "kubelet"
        self.log_path = workdir / "plugin.log"
        self.args = [
            "--log-format=text",
            f"--node-name={node}",
            f"--kubeconfig={kubeconfig}",
            f"--runtime-socket={runtime_dir / 'runtime.sock'}",
            f"--kubelet-dir={self.kubelet_dir}",
            f"--cdi-dir={workdir / 'cdi'}",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        """Start the plugin (its output appended to the log)."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                plugin_argv(*self.args, *extra), stdout=log, stderr=subprocess.STDOUT
            )
        return self.proc

    def log(self) -> str:
        """Everything the plugin logged."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def serving(self) -> bool:
        """Both sockets are there."""
        return (
            service_socket(self.kubelet_dir, DRIVER).exists()
            and registration_socket(self.kubelet_dir, DRIVER).exists()
        )

    def stop(self) -> int:
        """SIGTERM, and the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture
def node_name(kube: KubeClient) -> Iterator[str]:
    """A Node object for the plugin's node."""
    name = f"dra-{uuid.uuid4().hex[:8]}"
    kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": name}})
    yield name
    kube.request("DELETE", f"/api/v1/nodes/{name}")


def node_slices(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    """The ResourceSlices of the node's pool."""
    items: list[dict[str, Any]] = kube.request(
        "GET", SLICES, query={"fieldSelector": f"spec.nodeName={node}"}
    )["items"]
    return items


def held_keys(sim: SimulatorProcess) -> list[str] | NotYet:
    """The container keys the Runtime holds (blocking; NotYet while it holds none)."""
    with grpc.insecure_channel(sim.runtime_target) as channel:
        answer = pb_grpc.AllocationServiceStub(channel).ListAllocations(
            pb.ListAllocationsRequest(), timeout=5
        )
    return sorted(a.container_key for a in answer.allocations) or NotYet("nothing held")


async def prepare(plugin: Plugin, claim: v1.Claim) -> v1.NodePrepareResourceResponse:
    """NodePrepareResources of one claim, as the kubelet calls it."""
    target = f"unix:{service_socket(plugin.kubelet_dir, DRIVER)}"
    async with grpc.aio.insecure_channel(target) as channel:
        answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[claim]), timeout=45
        )
    return answer.claims[claim.uid]


@pytest.mark.controlplane
async def test_plugin_on_a_node(
    workdir: Path, dra_cp: Any, kube: KubeClient, ns: str, node_name: str
) -> None:
    with SimulatorProcess(workdir / "rt", EXAMPLE_NODES / "tdm-8gpu.yaml") as sim:
        plugin = Plugin(workdir, dra_cp.kubeconfig_path, node_name, sim.socket_dir)
        plugin.start()
        try:
            wait_for(plugin.serving, 30, "the plugin's sockets", describe=plugin.log)
            slices = wait_for(lambda: node_slices(kube, node_name), 30, "the node's slices")
            assert {s["spec"]["driver"] for s in slices} == {DRIVER}
            target = f"unix:{registration_socket(plugin.kubelet_dir, DRIVER)}"
            async with grpc.aio.insecure_channel(target) as channel:
                info = await reg_grpc.RegistrationStub(channel).GetInfo(
                    reg.InfoRequest(), timeout=5
                )
            assert info.endpoint == str(service_socket(plugin.kubelet_dir, DRIVER))

            ref = write_claim(kube, ns, "job", [result("gpu-3", pool=node_name)])
            claim = v1.Claim(namespace=ns, name="job", uid=ref.uid)
            first = await prepare(plugin, claim)
            assert first.error == ""
            assert [d.device_name for d in first.devices] == ["gpu-3"]

            assert plugin.stop() == 0
            assert not plugin.serving()
            assert node_slices(kube, node_name), "slices stay after SIGTERM"

            plugin.start()  # a restart between prepare and unprepare
            wait_for(plugin.serving, 30, "the plugin's sockets again", describe=plugin.log)
            assert await prepare(plugin, claim) == first
            async with RuntimeClient(sim.socket_dir, RUNTIME_SOCKET) as runtime:
                keys = [a.container_key for a in await runtime.list_allocations()]
            assert keys == [container_key(ref.uid)]

            sim.stop()  # a Runtime that restarts without its allocations, the plugin running
            with SimulatorProcess(sim.socket_dir, EXAMPLE_NODES / "tdm-8gpu.yaml") as again:
                keys = wait_for(
                    lambda: held_keys(again),
                    30,
                    "the claim allocated again in the restarted Runtime",
                    describe=plugin.log,
                )
                assert keys == [container_key(ref.uid)]
                assert await prepare(plugin, claim) == first
                assert held_keys(again) == [container_key(ref.uid)]
                assert plugin.stop() == 0
        finally:
            if plugin.proc is not None and plugin.proc.poll() is None:
                plugin.proc.kill()
                plugin.proc.wait(10)

        status = plugin.start("--remove-slices").wait(60)
        assert status == 0, plugin.log()
        assert node_slices(kube, node_name) == []
        assert "Traceback" not in plugin.log()
