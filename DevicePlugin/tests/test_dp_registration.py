"""Registration of every resource, device counts per example node, gates, restarts, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lj_runtimekit.deviceplugin.internal.plugin.server import socket_name
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess
from lj_runtimekit.testkit.kubelet.bed import CORE, GPU, MEMORY, RES, Bed
from lj_runtimekit.testkit.kubelet.process import PluginProcess
from lj_runtimekit.testkit.podserver import PodListServer

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]
MIG_1G, MIG_3G, MIG_4G = RES.mig("1g.10gb"), RES.mig("3g.40gb"), RES.mig("4g.40gb")


def counts(bed_kubelet: object) -> dict[str, int]:
    plugins = bed_kubelet.plugins  # type: ignore[attr-defined]
    return {r: len(v.devices) for r, v in plugins.items()}


async def test_tdm_node_registers_every_resource(make_bed: BedFactory) -> None:
    async with make_bed("tdm-8gpu", wait_for=(GPU, CORE, MEMORY, RES.ppu, RES.amd)) as bed:
        assert counts(bed.kubelet) == {GPU: 8, CORE: 800, MEMORY: 800, RES.ppu: 0, RES.amd: 0}
        regs = {r.resource: r for r in bed.kubelet.registrations}
        assert regs[GPU].endpoint == socket_name(GPU)
        assert regs[GPU].options.get_preferred_allocation_available
        gpus = bed.kubelet.devices(GPU)
        for dev in bed.devices:
            listed = gpus[dev.id]
            assert listed.health == "Healthy"
            assert [n.ID for n in listed.topology.nodes] == [dev.numa_node]
        units = bed.kubelet.devices(CORE)
        assert f"{bed.gpu(0)}::0" in units
        assert f"{bed.gpu(7)}::99" in units
        assert max(len(i) for i in units) <= 63


async def test_mig_node_offers_profiles_and_nothing_else_on_mig_gpus(make_bed: BedFactory) -> None:
    every = (GPU, CORE, MEMORY, RES.ppu, RES.amd, MIG_1G, MIG_3G, MIG_4G)
    async with make_bed("mig-8gpu", wait_for=every) as bed:
        assert counts(bed.kubelet) == {
            GPU: 6,
            CORE: 600,
            MEMORY: 600,
            RES.ppu: 0,
            RES.amd: 0,
            MIG_1G: 7,
            MIG_3G: 1,
            MIG_4G: 1,
        }
        mig_parents = {bed.gpu(6), bed.gpu(7)}
        assert not mig_parents & set(bed.kubelet.devices(GPU))
        instances = {m.id for d in bed.devices for m in d.mig_instances if m.profile == "1g.10gb"}
        assert set(bed.kubelet.devices(MIG_1G)) == instances


async def test_ppu_node(make_bed: BedFactory) -> None:
    async with make_bed("ppu-16", wait_for=(GPU, CORE, MEMORY, RES.ppu)) as bed:
        found = counts(bed.kubelet)
        assert found[RES.ppu] == 16
        assert found[GPU] == found[CORE] == found[MEMORY] == 0


async def test_feature_gate_off_drops_mig_only(make_bed: BedFactory) -> None:
    async with make_bed("mig-8gpu", version="v1.13.0") as bed:
        found = counts(bed.kubelet)
        assert found == {GPU: 6, CORE: 600, MEMORY: 600}
        assert not any(RES.mig_profile(r) for r in found)
        assert "feature mig is off: it needs Runtime v1.14.0" in bed.plugin.log()


def test_runtime_too_old_refuses_to_start(workdir: Path) -> None:
    (workdir / "dp").mkdir()
    with (
        SimulatorProcess(workdir / "rt", EXAMPLE_NODES / "tdm-8gpu.yaml", version="v1.12.3"),
        PodListServer() as pods,
    ):
        plugin = PluginProcess(workdir / "dp", workdir / "rt", pods.url).start()
        assert plugin.wait(30) == 1
        log = plugin.log()
        assert "Runtime v1.12.3 is too old" in log
        assert "v1.13.0 or newer" in log
        assert "Traceback" not in log


def test_no_pod_source_refuses_to_start(workdir: Path) -> None:
    """The kubelet's /pods does not answer and there is no API access: no Allocate could be
    answered, so the plugin advertises nothing and exits with one line."""
    (workdir / "dp").mkdir()
    with SimulatorProcess(workdir / "rt", EXAMPLE_NODES / "tdm-8gpu.yaml"):
        plugin = PluginProcess(workdir / "dp", workdir / "rt", "http://127.0.0.1:9/pods").start()
        assert plugin.wait(30) == 1
        log = plugin.log()
        assert "cannot start reason=\"cannot list the node's pods" in log
        assert "Traceback" not in log
        assert not list((workdir / "dp").glob("lj-*.sock"))


async def test_kubelet_restart_reregisters_within_two_seconds(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        before = len(bed.kubelet.registrations)
        start = time.monotonic()
        await bed.kubelet.restart()
        await bed.kubelet.wait_registered((GPU, CORE, MEMORY, RES.ppu, RES.amd), 5, since=start)
        elapsed = time.monotonic() - start
        assert elapsed <= 2.0, bed.fail(f"re-registration took {elapsed:.2f} s")
        assert len(bed.kubelet.registrations) >= before + 5
        assert len(bed.kubelet.devices(CORE)) == 800
        for resource in (GPU, CORE, MEMORY):
            assert (bed.plugin_dir / socket_name(resource)).is_socket()


async def test_sigterm_removes_own_sockets(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        sockets = [bed.plugin_dir / socket_name(r) for r in (GPU, CORE, MEMORY)]
        assert all(s.is_socket() for s in sockets)
        assert bed.plugin.stop() == 0
        assert not any(s.exists() for s in sockets)
        assert (bed.plugin_dir / "kubelet.sock").exists()
        bed.plugin.start()  # the fixture expects a running plugin at exit
        await bed.kubelet.wait_registered((GPU,), 30, since=time.monotonic())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label-node=true"], "--label-node needs API server access"),
        (["--protocol-file=/nonexistent/protocol.yaml"], "cannot read protocol file"),
        (
            ["--kubelet-pods-url=ftp://x/pods"],
            "--kubelet-pods-url: 'ftp://x/pods' must be an http:// or https:// URL",
        ),
        (["--kubelet-pods-url="], "no source for the node's pods"),
    ],
)
def test_operator_mistakes_exit_1_with_one_line(
    workdir: Path, args: list[str], message: str
) -> None:
    plugin = PluginProcess(workdir / "dp", workdir / "rt", "http://127.0.0.1:1/pods")
    plugin.args.extend(args)
    plugin.start()
    assert plugin.wait(30) == 1
    log = plugin.log()
    assert message in log
    assert "Traceback" not in log


async def test_registration_retries_until_the_kubelet_answers(make_bed: BedFactory) -> None:
    async with make_bed() as bed:
        await bed.kubelet.stop()
        # A kubelet.sock nobody answers on (a kubelet still starting): registration fails.
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(bed.kubelet.socket_path))
        failed = f"registration failed, retrying resource={GPU} "
        try:
            # Each resource registers on its own: wait for the GPU's failure (under load the
            # other resources' may come first).
            deadline = time.monotonic() + 10
            while failed not in bed.plugin.log():
                assert time.monotonic() < deadline, bed.fail("no failed registration logged")
                await asyncio.sleep(0.05)
        finally:
            dead.close()
        start = time.monotonic()
        await bed.kubelet.start()
        await bed.kubelet.wait_registered((GPU, CORE, MEMORY), 5, since=start)
        assert time.monotonic() - start <= 2.0
        # Failures back off and are logged once, not every poll.
        assert bed.plugin.log().count(failed) == 1
