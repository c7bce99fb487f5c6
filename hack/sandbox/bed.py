"""The sandbox bed: control plane, N Lingjun nodes running the real kubelet, every component.

    with Sandbox(SandboxConfig(nodes=4)) as bed:
        bed.nodes[0].exporter_url ...

Per node (as the DaemonSets and the kubelet would run there): a Runtime
simulator (`lj-runtime-sim`, example nodes cycling TDM, MIG, PPU), a hollow
node (`lj-hollow-node`: the kubelet's own code with its real device manager,
PodResources API and read-only `/pods`, on its own loopback address; it
registers the Node; containers run in a fake runtime, except the Controller's
Job Agent, which it runs as a local process with the Runtime socket directory
mapped onto the node's simulator), the Device Plugin (`lj-device-plugin`) and
the Exporter (`lj-exporter`), each a subprocess in its own session with its own
directories, port, NODE_NAME and kubeconfig. Once: the Scheduler Framework
(`lj-scheduler`) and the Controller (`lj-controller`). Every process can be
killed and restarted (`Component.restart`), which is what the end-to-end tests
do. State and logs live under one directory (`sandbox.json` records the
process groups for `lj-sandbox down`).

With `SandboxConfig.dra` the nodes run in DRA mode (docs/dra.md): the control plane and the
kubelets are the DRA mode's release (`DRA_VERSION`), the nodes are labelled
`labels.device_api=dra`, the DeviceClasses are installed, and each node runs `lj-dra-plugin`
(publishing the node's ResourceSlices once its kubelet has wiped them) instead of the Device
Plugin.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes
from lj_runtimekit.deviceplugin.internal.dra.server import registration_socket, service_socket
from lj_runtimekit.envtest import DRA_VERSION, ControlPlane, ControlPlaneConfig, dra_gates
from lj_runtimekit.envtest.hollownode import HollowNode
from lj_runtimekit.envtest.process import Process, ProcessExitedError, log_tail
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2, podresources_pb2_grpc
from lj_runtimekit.proto.lingjun.runtimesim.v1 import admin_pb2, admin_pb2_grpc
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, Protocol, load_protocol
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.waits import NotYet, wait_for

DEFAULT_STATE_DIR = Path("/tmp/lj-sandbox")
NODE_KINDS = ("tdm-8gpu", "mig-8gpu", "ppu-16")
HOST_SOCKET_DIR = "/run/amp/eKitC/xdm/sockets"
"""The Runtime socket directory the Controller's Jobs mount (mapped per node by the hollow
node onto its simulator's directory)."""
JOB_AGENT = "lj-job-agent"
"""Containers the hollow nodes run for real (the Controller's Job Agent)."""
JOB_SERVICE_ACCOUNT = "lj-runtimekit-job-agent"
SYSTEM_NAMESPACE = "kube-system"
STATE_FILE = "sandbox.json"
RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"


class SandboxError(RuntimeError):
    """A step failed; the message names the step and the log to read."""


def _bin(name: str) -> str:
    """A console script installed beside this interpreter."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise SandboxError(f"{name} is not installed in {path.parent}; run `make sync`")
    return str(path)


@dataclass
class SandboxConfig:
    """What to start."""

    nodes: int = 4
    state_dir: Path = DEFAULT_STATE_DIR
    kinds: Sequence[str] = NODE_KINDS
    runtime_version: str | None = "v1.15.0"
    """Version every simulator reports (v1.15.0 turns on every gated feature); None keeps
    the node files' own."""
    exporter_interval_s: float = 2.0
    controller: bool = True
    scheduler: bool = True
    exporter: bool = True
    """False: no Exporter per node (benchmarks that only need the admission path)."""
    kubelet_read_only_port: bool = True
    """False: the kubelets keep port 10255's /pods closed; the Device Plugin then reads the
    node's pods from one API server watch, the Exporter from the API server."""
    release_grace_s: float = 1.0
    keep_state: bool = False
    start_timeout_s: float = 120.0
    dra: bool = False
    """True: the nodes run in DRA mode (`lj-dra-plugin`, see the module docstring)."""


@dataclass
class Component:
    """One managed process of the bed."""

    name: str
    process: Process
    ready: Callable[[], bool] | None = None
    """True once the component serves (checked after start and restart)."""

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def running(self) -> bool:
        return self.process.running()

    def start(self) -> None:
        self.process.start()

    def stop(self, grace_s: float = 10.0) -> None:
        self.process.stop(grace_s)

    def kill(self) -> None:
        """SIGKILL the process group (a crash)."""
        pid = self.process.pid
        if pid is not None and self.process.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.process.stop(0)

    def restart(self, timeout_s: float = 60.0, *, crash: bool = False) -> None:
        """Stop (or kill) and start again; wait until ready."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.process.check_running()
            except ProcessExitedError as exc:
                raise SandboxError(f"{self.name} exited: {exc}") from None
            if self.ready is None or self.ready():
                return
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"{self.name} not ready within {timeout_s:.0f}s; log {self.log_path}:\n"
                    f"{log_tail(self.log_path, 15)}"
                )
            time.sleep(0.2)


def _unix_grpc_ready(path: Path) -> bool:
    if not path.exists():
        return False
    with grpc.insecure_channel(f"unix:{path}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=0.5)
        except grpc.FutureTimeoutError:
            return False
    return True


def _http_ok(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback URL
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class NodeHandle:
    """One Lingjun node of the bed and its per-node components."""

    name: str
    kind: str
    dir: Path
    hollow: HollowNode
    exporter_port: int
    components: dict[str, Component] = field(default_factory=dict)

    @property
    def sim_dir(self) -> Path:
        return self.dir / "rt"

    @property
    def plugin_dir(self) -> Path:
        return self.hollow.plugin_dir

    @property
    def pods_url(self) -> str:
        """The kubelet's read-only /pods ("" when the bed keeps that port closed)."""
        return self.hollow.pods_url if self.hollow.read_only_port else ""

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources API socket."""
        return self.hollow.pod_resources_socket

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.exporter_port}/metrics"

    def kubelet_allocatable(self) -> dict[str, int]:
        """Healthy devices per resource in the kubelet's device manager (PodResources
        GetAllocatableResources): what the kubelet can hand out right now."""
        with grpc.insecure_channel(f"unix:{self.pod_resources_socket}") as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            got = stub.GetAllocatableResources(
                podresources_pb2.AllocatableResourcesRequest(), timeout=5
            )
        out: dict[str, int] = {}
        for d in got.devices:
            out[d.resource_name] = out.get(d.resource_name, 0) + len(d.device_ids)
        return out

    @property
    def sim(self) -> Component:
        return self.components["sim"]

    @property
    def kubelet(self) -> Component:
        return self.components["kubelet"]

    @property
    def plugin(self) -> Component:
        """The node's Device Plugin, or its DRA plugin on a DRA node."""
        return self.components.get("device-plugin") or self.components["dra-plugin"]

    @property
    def cdi_dir(self) -> Path:
        """Where the node's DRA plugin writes its CDI specs."""
        return self.dir / "cdi"

    @property
    def exporter(self) -> Component:
        return self.components["exporter"]

    @contextlib.contextmanager
    def admin(self) -> Iterator[admin_pb2_grpc.SimulatorAdminStub]:
        """The simulator's fault-injection admin interface."""
        with grpc.insecure_channel(f"unix:{self.sim_dir / 'sim-admin.sock'}") as channel:
            yield admin_pb2_grpc.SimulatorAdminStub(channel)

    def fail_allocations(self, skip: int, count: int) -> None:
        """This node's Runtime serves the next `skip` Allocate calls, then fails `count`."""
        with self.admin() as stub:
            request = admin_pb2.FailAllocationsRequest(skip=skip, count=count)
            stub.FailAllocations(request, timeout=5)

    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Mark a device of this node's simulator healthy or unhealthy."""
        with self.admin() as stub:
            stub.SetDeviceHealth(
                admin_pb2.SetDeviceHealthRequest(
                    device_id=device_id, healthy=healthy, reason=reason
                ),
                timeout=5,
            )


class Sandbox:
    """Starts and stops the whole bed; see the module docstring."""

    def __init__(
        self, config: SandboxConfig | None = None, progress: Callable[[str], None] | None = None
    ) -> None:
        self.config = config or SandboxConfig()
        self.state_dir = self.config.state_dir
        self.log_dir = self.state_dir / "logs"
        self.progress = progress or (lambda _msg: None)
        self.protocol: Protocol = load_protocol()
        self.cp: ControlPlane | None = None
        self.nodes: list[NodeHandle] = []
        self.components: dict[str, Component] = {}
        """Cluster-wide components: scheduler, controller."""
        self._step = 0
        self.started_s = 0.0

    # -- public ---------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "cp" / "kubeconfig"

    def api_client(self) -> k8s_client.ApiClient:
        if self.cp is None:
            raise SandboxError("the sandbox is not started")
        return self.cp.api_client()

    def all_components(self) -> list[Component]:
        out = [c for n in self.nodes for c in n.components.values()]
        return out + list(self.components.values())

    def node(self, name: str) -> NodeHandle:
        return next(n for n in self.nodes if n.name == name)

    @contextlib.contextmanager
    def step(self, what: str, log: Path | None = None) -> Iterator[None]:
        """Announce a step; on failure raise SandboxError naming it and its log."""
        self._step += 1
        number = self._step
        began = time.monotonic()
        self.progress(f"step {number}: {what} ...")
        try:
            yield
        except SandboxError as exc:
            raise SandboxError(f"step {number} ({what}) failed: {exc}") from None
        except Exception as exc:
            where = f"; log: {log}" if log else f"; logs in {self.log_dir}"
            raise SandboxError(
                f"step {number} ({what}) failed: {type(exc).__name__}: {exc}{where}"
            ) from None
        self.progress(f"step {number}: {what}: done in {time.monotonic() - began:.1f}s")

    def start(self) -> Sandbox:
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop(failed=True)
            raise
        self.started_s = time.monotonic() - began
        return self

    def stop(self, failed: bool = False) -> None:
        """Stop every process (cluster-wide, then per node, then the control plane)."""
        for comp in reversed(self.all_components()):
            with contextlib.suppress(Exception):
                comp.stop(5)
        if self.cp is not None:
            self.cp.stop(failed=failed)
            self.cp = None
        if failed or self.config.keep_state:
            self.progress(f"state and logs kept in {self.state_dir}")
            return
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(failed=exc is not None and not isinstance(exc, KeyboardInterrupt))

    # -- start-up -------------------------------------------------------------------------

    def _start(self) -> None:
        cfg = self.config
        if cfg.nodes < 1:
            raise SandboxError(f"nodes must be >= 1, got {cfg.nodes}")
        if self.state_dir.exists():
            cleanup_leftovers(self.state_dir)
            shutil.rmtree(self.state_dir)
        self.log_dir.mkdir(parents=True)
        cp_dir = self.state_dir / "cp"
        with self.step(
            "start the control plane (etcd, kube-apiserver, controller-manager, kube-scheduler)",
            cp_dir / "logs",
        ):
            self.cp = ControlPlane(
                ControlPlaneConfig(
                    state_dir=cp_dir,
                    keep_state=True,
                    kwok=False,
                    version=DRA_VERSION if cfg.dra else None,
                    feature_gates=dra_gates(DRA_VERSION) if cfg.dra else {},
                )
            ).start()
        self._write_state()
        with self.step(f"prepare {cfg.nodes} Lingjun nodes"):
            self._create_nodes()
        if cfg.dra:
            with self.step("install the DRA driver's DeviceClasses"):
                self._install_device_classes()
        with self.step("start a Runtime simulator per node"):
            for node in self.nodes:
                self._start_sim(node)
            for node in self.nodes:
                node.sim.wait_ready(cfg.start_timeout_s)
        self._write_state()
        plugin = "DRA plugin" if cfg.dra else "Device Plugin"
        with self.step(f"start the kubelet (hollow node), {plugin} and Exporter per node"):
            for node in self.nodes:
                self._add_node_agents(node)
                node.kubelet.start()
            for node in self.nodes:
                node.kubelet.wait_ready(cfg.start_timeout_s)
                if cfg.dra:
                    self._wait_slices_wiped(node)
            for node in self.nodes:
                node.plugin.start()
                if cfg.exporter:
                    node.exporter.start()
            for node in self.nodes:
                node.plugin.wait_ready(cfg.start_timeout_s)
                if cfg.exporter:
                    node.exporter.wait_ready(cfg.start_timeout_s)
        self._write_state()
        if cfg.dra:
            with self.step("wait for each node's ResourceSlices"):
                self._wait_slices()
        else:
            with self.step("wait for device plugin registration and node capacity"):
                self._wait_capacity()
        if cfg.scheduler or cfg.controller:
            with self.step("start the Scheduler Framework and the Controller"):
                self._start_cluster_components()
                for comp in self.components.values():
                    comp.wait_ready(cfg.start_timeout_s)
        self._write_state()

    def _spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        *,
        die_with_parent: bool = True,
    ) -> Process:
        """A component process; `env` is set for it alone (env(1) execs the command).
        `die_with_parent=False` for a binary that sets its parent-death signal itself."""
        prefix = ["/usr/bin/env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        log = self.log_dir / f"{name}.log"
        return Process(name, [*prefix, *argv], log, die_with_parent=die_with_parent)

    def _create_nodes(self) -> None:
        """The cluster objects the nodes' workloads need, and a handle per node (each
        node's kubelet registers its Node when it starts)."""
        assert self.cp is not None
        kinds = list(self.config.kinds)
        with self.cp.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            rbac_sa = {"metadata": {"name": JOB_SERVICE_ACCOUNT}}
            with contextlib.suppress(ApiException):
                core.create_namespaced_service_account(SYSTEM_NAMESPACE, rbac_sa)
            node_api = k8s_client.NodeV1Api(api)
            with contextlib.suppress(ApiException):
                node_api.create_runtime_class(
                    {"metadata": {"name": "lj-runtime"}, "handler": "lj-runtime"}
                )
        for i in range(self.config.nodes):
            kind = kinds[i % len(kinds)]
            name = f"lj-{kind.split('-')[0]}-{i}"
            node_dir = self.state_dir / name
            node_dir.mkdir(parents=True)
            labels = {"lj-sandbox": "true"}
            if self.config.dra:
                labels[self.protocol.labels.device_api] = DRA_MODE
            hollow = HollowNode(
                self.cp,
                name,
                address=f"127.0.0.{2 + i}",
                labels=labels,
                state_dir=node_dir / "kubelet",
                read_only_port=self.config.kubelet_read_only_port,
                exec_command_prefix=JOB_AGENT,
                exec_path_map={HOST_SOCKET_DIR: str(node_dir / "rt")},
                ready_timeout_s=self.config.start_timeout_s,
            )
            node = NodeHandle(
                name=name, kind=kind, dir=node_dir, hollow=hollow, exporter_port=free_port()
            )
            node.sim_dir.mkdir(parents=True)
            self.nodes.append(node)

    def _start_sim(self, node: NodeHandle) -> None:
        argv = [
            _bin("lj-runtime-sim"),
            "--node",
            str(EXAMPLE_NODES / f"{node.kind}.yaml"),
            "--socket-dir",
            str(node.sim_dir),
        ]
        if self.config.runtime_version:
            argv += ["--version", self.config.runtime_version]
        comp = Component(
            f"{node.name}/runtime-sim",
            self._spawn(f"{node.name}-runtime-sim", argv),
            ready=lambda: (
                _unix_grpc_ready(node.sim_dir / "runtime.sock")
                and _unix_grpc_ready(node.sim_dir / "sim-admin.sock")
            ),
        )
        node.components["sim"] = comp
        comp.start()

    def _add_node_agents(self, node: NodeHandle) -> None:
        kubeconfig = str(self.kubeconfig)
        env = {"NODE_NAME": node.name, "KUBECONFIG": kubeconfig}
        kubelet = Component(
            f"{node.name}/kubelet",
            self._spawn(f"{node.name}-kubelet", node.hollow.prepare(), die_with_parent=False),
            ready=lambda: node.hollow.serving() and node.hollow.node_ready(),
        )
        # The hollow node reads its own log (the ResourceSlices wipe); it is the bed's.
        node.hollow.log_path.unlink(missing_ok=True)
        node.hollow.log_path.symlink_to(kubelet.log_path)
        plugin = self._dra_plugin(node) if self.config.dra else self._device_plugin(node, env)
        exporter = Component(
            f"{node.name}/exporter",
            self._spawn(
                f"{node.name}-exporter",
                [
                    _bin("lj-exporter"),
                    f"--runtime-socket-dir={node.sim_dir}",
                    # With port 10255 closed: a URL that refuses, so the API server serves.
                    f"--kubelet-pods-url={node.pods_url or 'http://127.0.0.1:9/pods'}",
                    f"--pod-resources-socket={node.pod_resources_socket}",
                    f"--node-name={node.name}",
                    f"--kubeconfig={kubeconfig}",
                    f"--collection-interval={self.config.exporter_interval_s}",
                    "--listen-address=127.0.0.1",
                    f"--port={node.exporter_port}",
                    "--log-format=text",
                ],
                env,
            ),
            ready=lambda: _http_ok(f"http://127.0.0.1:{node.exporter_port}/healthz"),
        )
        node.components.update(
            {"kubelet": kubelet, "dra-plugin" if self.config.dra else "device-plugin": plugin}
        )
        if self.config.exporter:
            node.components["exporter"] = exporter

    def _device_plugin(self, node: NodeHandle, env: dict[str, str]) -> Component:
        """`lj-device-plugin` on the node's device plugin directory and Runtime; ready once
        the kubelet holds its devices healthy."""
        kubeconfig = str(self.kubeconfig)
        return Component(
            f"{node.name}/device-plugin",
            self._spawn(
                f"{node.name}-device-plugin",
                [
                    _bin("lj-device-plugin"),
                    f"--plugin-dir={node.plugin_dir}",
                    f"--runtime-socket-dir={node.sim_dir}",
                    f"--kubelet-pods-url={node.pods_url}",
                    f"--pod-resources-socket={node.pod_resources_socket}",
                    f"--node-name={node.name}",
                    f"--kubeconfig={kubeconfig}",
                    "--label-node=true",
                    f"--release-grace={self.config.release_grace_s:g}",
                    "--collect-interval=2",
                    "--log-format=text",
                ],
                env,
            ),
            ready=lambda: self._plugin_registered(node),
        )

    def _dra_plugin(self, node: NodeHandle) -> Component:
        """`lj-dra-plugin` on the node's kubelet directory, Runtime socket and CDI directory;
        ready once the kubelet can dial it."""
        driver = self.protocol.dra.driver
        kubelet_dir = node.hollow.root_dir
        return Component(
            f"{node.name}/dra-plugin",
            self._spawn(
                f"{node.name}-dra-plugin",
                [
                    _bin("lj-dra-plugin"),
                    f"--node-name={node.name}",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--runtime-socket={node.sim_dir / RUNTIME_SOCKET}",
                    f"--kubelet-dir={kubelet_dir}",
                    f"--cdi-dir={node.cdi_dir}",
                    "--log-format=text",
                ],
            ),
            ready=lambda: (
                _unix_grpc_ready(registration_socket(kubelet_dir, driver))
                and _unix_grpc_ready(service_socket(kubelet_dir, driver))
            ),
        )

    def expected_resources(self, node: NodeHandle) -> set[str]:
        """The extended resources a node's plugin registers (by its example node kind)."""
        res = self.protocol.resources
        if node.kind.startswith("ppu"):
            return {res.ppu}
        if node.kind.startswith("mig"):
            return {res.gpu, res.core, res.memory, res.mig("1g.10gb")}
        return {res.gpu, res.core, res.memory}

    def _plugin_registered(self, node: NodeHandle) -> bool:
        """The plugin serves its sockets and the kubelet holds its devices healthy (after a
        plugin crash the kubelet rejects device pods until then)."""
        sockets = list(node.plugin_dir.glob("lj-*.sock"))
        if not sockets or not all(_unix_grpc_ready(s) for s in sockets):
            return False
        try:
            healthy = node.kubelet_allocatable()
        except grpc.RpcError:
            return False
        return all(healthy.get(r, 0) > 0 for r in self.expected_resources(node))

    def _wait_capacity(self) -> None:
        assert self.cp is not None
        deadline = time.monotonic() + self.config.start_timeout_s
        with self.cp.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            for node in self.nodes:
                want = self.expected_resources(node)
                while True:
                    obj = core.read_node(node.name)
                    have = {
                        k for k, v in (obj.status.allocatable or {}).items() if str(v) not in ("0",)
                    }
                    annotations = obj.metadata.annotations or {}
                    inventory = self.protocol.annotations.node_devices in annotations
                    if want <= have and inventory:
                        break
                    for comp in node.components.values():
                        try:
                            comp.process.check_running()
                        except ProcessExitedError as exc:
                            raise SandboxError(str(exc)) from None
                    if time.monotonic() > deadline:
                        raise SandboxError(
                            f"node {node.name} has {sorted(have)} of {sorted(want)},"
                            f" inventory annotation {'present' if inventory else 'absent'};"
                            f" see {node.plugin.log_path} and {node.hollow.log_path}"
                        )
                    time.sleep(0.3)

    def _install_device_classes(self) -> None:
        """The driver's DeviceClasses as `deploy/` renders them (no extended resources)."""
        with self.api_client() as api:
            custom = k8s_client.CustomObjectsApi(api)
            for obj in device_classes(self.protocol, extended_resources=False):
                custom.create_cluster_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", obj
                )

    def _wait_slices_wiped(self, node: NodeHandle) -> None:
        """Until the node's kubelet has deleted its ResourceSlices at start: slices the
        plugin published before that would be lost."""

        def wiped() -> bool:
            node.kubelet.process.check_running()
            return node.hollow.resource_slices_wiped()

        wait_for(
            wiped,
            self.config.start_timeout_s,
            f"the kubelet of {node.name} to delete its slices (log {node.kubelet.log_path})",
        )

    def _wait_slices(self) -> None:
        """Until every node's DRA plugin has published its pool whole: as many slices of
        the newest generation as the pool counts (kube-scheduler skips an incomplete
        pool)."""
        with self.api_client() as api:
            custom = k8s_client.CustomObjectsApi(api)
            for node in self.nodes:

                def published(node: NodeHandle = node) -> bool | NotYet:
                    node.plugin.process.check_running()
                    listed = custom.list_cluster_custom_object(
                        RESOURCE_GROUP,
                        RESOURCE_VERSION,
                        "resourceslices",
                        field_selector=f"spec.nodeName={node.name}",
                    )
                    pools = [s["spec"]["pool"] for s in listed.get("items") or ()]
                    if not pools:
                        return NotYet("no slices")
                    newest = max(p["generation"] for p in pools)
                    current = [p for p in pools if p["generation"] == newest]
                    want = current[0]["resourceSliceCount"]
                    return len(current) == want or NotYet(
                        f"{len(current)} of the {want} slices of pool generation {newest}"
                    )

                wait_for(
                    published,
                    self.config.start_timeout_s,
                    f"ResourceSlices of {node.name} (log {node.plugin.log_path})",
                )

    def _start_cluster_components(self) -> None:
        kubeconfig = str(self.kubeconfig)
        if self.config.scheduler:
            port = free_port()
            sched = Component(
                "scheduler",
                self._spawn(
                    "scheduler",
                    [
                        _bin("lj-scheduler"),
                        f"--kubeconfig={kubeconfig}",
                        "--leader-elect=false",
                        f"--metrics-port={port}",
                        "--log-format=text",
                    ],
                ),
                ready=functools.partial(_http_ok, f"http://127.0.0.1:{port}/metrics"),
            )
            self.components["scheduler"] = sched
            sched.start()
        if self.config.controller:
            port = free_port()
            ctrl = Component(
                "controller",
                self._spawn(
                    "controller",
                    [
                        _bin("lj-controller"),
                        "--job-image=lj-runtimekit-controller-job-agent:sandbox",
                        f"--kubeconfig={kubeconfig}",
                        "--leader-elect=false",
                        f"--socket-dir={HOST_SOCKET_DIR}",
                        f"--health-port={port}",
                        "--log-format=text",
                    ],
                ),
                ready=functools.partial(_http_ok, f"http://127.0.0.1:{port}/readyz"),
            )
            self.components["controller"] = ctrl
            ctrl.start()

    def _write_state(self) -> None:
        """Record process groups, ports and the kubeconfig for `lj-sandbox down` and users."""
        groups = [c.process.pid for c in self.all_components() if c.process.pid is not None]
        if self.cp is not None:
            groups += [p.pid for p in self.cp.processes if p.pid is not None]
        state: dict[str, Any] = {
            "pid": os.getpid(),
            "process_groups": groups,
            "kubeconfig": str(self.kubeconfig),
            "nodes": [
                {
                    "name": n.name,
                    "kind": n.kind,
                    "runtime_socket_dir": str(n.sim_dir),
                    "plugin_dir": str(n.plugin_dir),
                    "pods_url": n.pods_url,
                    "pod_resources_socket": str(n.pod_resources_socket),
                    "metrics_url": n.metrics_url,
                }
                for n in self.nodes
            ],
        }
        (self.state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")


def cleanup_leftovers(state_dir: Path) -> list[int]:
    """Kill the process groups a sandbox under `state_dir` recorded; return those killed."""
    try:
        state = json.loads((state_dir / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    killed = []
    for pgid in state.get("process_groups") or []:
        try:
            cmdline = Path(f"/proc/{int(pgid)}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue
        if str(state_dir).encode() not in cmdline:
            continue  # the id was reused by a process that is not ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pgid), signal.SIGKILL)
            killed.append(int(pgid))
    return killed
