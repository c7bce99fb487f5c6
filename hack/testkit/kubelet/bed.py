"""A node bed: the Runtime simulator, the kubelet shim, a kubelet `/pods` server and the plugin.

Used by the tests, the benchmark and the sandbox.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeClient
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess
from lj_runtimekit.testkit.kubelet.kubelet import KubeletShim
from lj_runtimekit.testkit.kubelet.process import PluginProcess
from lj_runtimekit.testkit.podserver import PodListServer, pod_object

PROTOCOL = load_protocol()
RES = PROTOCOL.resources
ANN = PROTOCOL.annotations
GPU, CORE, MEMORY = RES.gpu, RES.core, RES.memory


@dataclass
class Bed:
    """One node: simulator, kubelet shim, `/pods` server and the plugin process."""

    root: Path
    sim: SimulatorProcess
    pods: PodListServer
    kubelet: KubeletShim
    plugin: PluginProcess
    devices: list[rpb.Device] = field(default_factory=list)
    _n: int = 0

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet.plugin_dir

    def gpu(self, index: int) -> str:
        """ID of the device with this index."""
        return next(d.id for d in self.devices if d.index == index)

    def pod(
        self,
        containers: dict[str, dict[str, int]],
        assignment: dict[str, list[DeviceShare]] | None = None,
        *,
        raw_assignment: str | None = None,
        assume: int | None = None,
        name: str | None = None,
        listed: bool = True,
    ) -> dict[str, Any]:
        """A pending pod with the scheduler's assignment.

        `listed` puts it in the kubelet's `/pods` at once (as the API server sees
        every bound pod); otherwise it appears there when the shim admits it, as
        with a real kubelet.
        """
        self._n += 1
        annotations = {}
        if assignment is not None:
            annotations[ANN.assigned_devices] = encode_assignment(
                {c: tuple(s) for c, s in assignment.items()}
            )
        if raw_assignment is not None:
            annotations[ANN.assigned_devices] = raw_assignment
        annotations[ANN.assume_time] = str(assume if assume is not None else 1_000 + self._n)
        pod = pod_object(
            name or f"pod-{self._n}",
            containers,
            uid=f"uid-{self._n:04d}",
            node_name="node-1",
            annotations=annotations,
        )
        if listed:
            self.pods.put(pod)
        return pod

    async def allocations(self) -> list[rpb.Allocation]:
        async with RuntimeClient(self.sim.socket_dir) as client:
            return await client.list_allocations()

    def fail(self, message: str) -> str:
        return f"{message}\n--- plugin log ---\n{self.plugin.log()[-6000:]}"


class BedError(Exception):
    """The plugin did not come up; the message holds its log."""


@contextlib.asynccontextmanager
async def node_bed(
    root: Path,
    node: str = "tdm-8gpu",
    *,
    version: str | None = None,
    plugin_args: Sequence[str] = (),
    wait_for: Sequence[str] = (GPU, CORE, MEMORY),
    register_timeout_s: float = 30.0,
) -> AsyncIterator[Bed]:
    """Start a bed for an example node under `root` (short path: unix sockets live there).

    When it yields, the plugin registered every resource of `wait_for` and listed
    its devices.
    """
    plugin_dir = root / "dp"
    plugin_dir.mkdir()
    with (
        SimulatorProcess(root / "rt", EXAMPLE_NODES / f"{node}.yaml", version=version) as sim,
        PodListServer() as pods,
    ):
        async with KubeletShim(plugin_dir, pods) as kubelet:
            plugin = PluginProcess(
                plugin_dir,
                root / "rt",
                pods.url,
                extra_args=["--release-grace=0", "--collect-interval=0.5", *plugin_args],
            )
            async with RuntimeClient(root / "rt") as client:
                devices = await client.list_devices()
            bed = Bed(root, sim, pods, kubelet, plugin, devices)
            with plugin:
                try:
                    await kubelet.wait_registered(wait_for, register_timeout_s)
                except TimeoutError:
                    raise BedError(bed.fail("plugin did not register in time")) from None
                yield bed
