"""`lj-dra-plugin`'s footprint: neither its modules nor a running plugin load the official
Kubernetes client (every generated API and model class, tens of MB in each process), and a
running plugin's resident memory stays within the DaemonSet's budget."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit.proto.k8s.dra.v1 import api_pb2 as v1
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess
from lj_runtimekit.testkit.imports import official_client
from lj_runtimekit.testkit.kubeconfig import unreachable_kubeconfig
from lj_runtimekit.testkit.procfs import status_mb
from lj_runtimekit.testkit.waits import wait_for

from . import test_dra_cmd as cmd
from .test_dra_prepare import result, write_claim

# the control plane, namespace and node fixtures of the command tests, for this module
dra_cp, kube, ns, node_name = cmd.dra_cp, cmd.kube, cmd.ns, cmd.node_name

RSS_BUDGET_MB = 80.0
"""The resident memory a serving plugin may use (one per DRA node)."""

BUILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from lj_runtimekit.deviceplugin.cmd.dra_plugin import main as plugin
    from lj_runtimekit.deviceplugin.internal.dra.cdi import CdiSpecs
    from lj_runtimekit.deviceplugin.internal.dra.checkpoint import Checkpoint
    from lj_runtimekit.deviceplugin.internal.dra.prepare import Preparer
    from lj_runtimekit.deviceplugin.internal.dra.publisher import SlicePublisher
    from lj_runtimekit.deviceplugin.internal.dra.server import PluginServers
    from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient

    async def build(cfg):
        runtime = RuntimeClient(cfg.runtime_socket.parent, cfg.runtime_socket.name, RetryPolicy())
        driver = cfg.protocol.dra.driver
        SlicePublisher(cfg.kube, runtime, cfg.protocol, cfg.node_name)
        cdi, checkpoint = CdiSpecs(cfg.cdi_dir, driver), Checkpoint(cfg.state_dir)
        preparer = Preparer(cfg.kube, runtime, driver, cfg.node_name, cdi, checkpoint)
        PluginServers(cfg.kubelet_dir, driver, preparer)
        await runtime.close()

    asyncio.run(build(plugin._config(plugin._parser().parse_args(sys.argv[1:]))))
    print(json.dumps(sorted(sys.modules)))
    """
)

RUN = textwrap.dedent(
    """
    import atexit, json, sys
    out = sys.argv.pop(1)
    atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
    from lj_runtimekit.deviceplugin.cmd.dra_plugin.main import main
    sys.exit(main(sys.argv[1:]))
    """
)
"""The plugin's own main, writing the modules it loaded when it exits."""


def start_recording(plugin: cmd.Plugin, modules_file: Path) -> subprocess.Popen[bytes]:
    """Start the plugin through `RUN` (its output appended to its log)."""
    with plugin.log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", RUN, str(modules_file), *plugin.args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def test_the_plugins_objects_load_no_official_client(tmp_path: Path) -> None:
    kubeconfig = unreachable_kubeconfig(tmp_path)
    args = [
        "--node-name=n1",
        f"--kubeconfig={kubeconfig}",
        f"--runtime-socket={tmp_path / 'runtime.sock'}",
        f"--kubelet-dir={tmp_path / 'kubelet'}",
        f"--cdi-dir={tmp_path / 'cdi'}",
    ]
    done = subprocess.run(
        [sys.executable, "-c", BUILD, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout)
    assert "lj_runtimekit.deviceplugin.internal.dra.naming" in modules
    assert official_client(modules) == []


@pytest.mark.controlplane
async def test_a_serving_plugin_loads_no_official_client_and_fits_its_budget(
    workdir: Path,
    dra_cp: Any,
    kube: KubeClient,
    ns: str,
    node_name: str,
    record_property: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    modules_file = workdir / "modules.json"
    with SimulatorProcess(workdir / "rt", EXAMPLE_NODES / "tdm-8gpu.yaml") as sim:
        plugin = cmd.Plugin(workdir, dra_cp.kubeconfig_path, node_name, sim.socket_dir)
        plugin.proc = start_recording(plugin, modules_file)
        try:
            wait_for(plugin.serving, 30, "the plugin's sockets", describe=plugin.log)
            wait_for(lambda: cmd.node_slices(kube, node_name), 30, "the node's slices")
            # a TDM share: the consumed capacity is parsed on the prepare path
            ref = write_claim(
                kube, ns, "job", [result("gpu-2", pool=node_name, consumed={"cores": "30"})]
            )
            answer = await cmd.prepare(plugin, v1.Claim(namespace=ns, name="job", uid=ref.uid))
            assert answer.error == ""
            rss = status_mb(plugin.proc.pid)
            plugin.proc.send_signal(signal.SIGTERM)
            assert plugin.proc.wait(30) == 0, plugin.log()
        finally:
            if plugin.proc.poll() is None:
                plugin.proc.kill()
                plugin.proc.wait(10)
    record_property("plugin_rss_mb", round(rss, 1))
    with capsys.disabled():
        print(f"\nlj-dra-plugin serving: {rss:.1f} MB resident")
    assert official_client(json.loads(modules_file.read_text())) == []
    assert rss <= RSS_BUDGET_MB, f"lj-dra-plugin uses {rss:.1f} MB, over {RSS_BUDGET_MB} MB"
