"""A hollow node: the real kubelet's code (kubemark's hollow kubelet) with the kubelet's
real device manager and DRA manager, registered with a ControlPlane.

    with HollowNode(control_plane, "hollow-a", address="127.0.0.2") as node:
        ...  # a device plugin registers on node.plugin_dir / "kubelet.sock"

`lj-hollow-node` (hack/hollow-node, built by hack/k8s-tools.sh) runs containers in
an in-process fake CRI runtime (they run at once, nothing is executed), but pod
admission, device plugin registration, ListAndWatch into the Node's capacity,
Allocate (init containers first, device reuse), PreStartContainer, the device
checkpoint and the PodResources API are the kubelet's own. So is DRA: a DRA kubelet
plugin registers through `plugins_registry` (type DRAPlugin), the kubelet calls
NodePrepareResources before the pod's sandbox and NodeUnprepareResources once the pod is
gone, keeps its checkpoint (`dra_checkpoint_path`) and reports the claims in the
PodResources API; the CDI devices each container got are written down
(`container_cdi_devices`). Each node has its own root directory, plugin directory and
loopback address, so several run side by side. A node reports 64 CPUs and 512 GiB
(`--cpus`, `--memory-gib`), the size of a GPU node.

The kubelet deletes its node's ResourceSlices at start (no DRA driver has registered
yet) and a driver's 30 s after its plugin went away: publish slices after
`wait_resource_slices_wiped`, and again after a restart.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.envtest.controlplane import ControlPlane, feature_gate_args
from lj_runtimekit.envtest.nodes import node_ready
from lj_runtimekit.envtest.process import Process, ProcessExitedError
from lj_runtimekit.envtest.versions import find_tools
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.waits import wait_for

BINARY = "lj-hollow-node"
# sun_path holds 108 bytes, the terminating NUL included.
_MAX_SOCKET_PATH = 107
# What the kubelet's DRA plugin manager logs (at -v=3, turned on for its file alone) once
# it has deleted the node's ResourceSlices at start.
_SLICES_WIPED = '"Deleted ResourceSlices"'


class HollowNodeError(RuntimeError):
    """The hollow node did not start or died; the message has its log tail."""


class HollowNode:
    """One `lj-hollow-node` process for `control_plane`; see the module docstring.

    `address` is the loopback IP its kubelet server and read-only port listen on (Linux
    routes all of 127.0.0.0/8 to lo: use one per node). `state_dir` (default
    `<control plane state>/hollow/<name>`) holds the kubelet root directory `root/`, the
    log `hollow-node.log` and, unless `plugin_dir` is given, the device plugin directory
    `root/device-plugins/`. `exec_command_prefix`: containers whose command[0] starts
    with it run as local processes (with the container's environment, the device
    plugin's Allocate envs included; output in `root/exec-logs/`) and end with their
    exit code; other containers run until deleted. Admin credentials: the control plane
    authorizes with RBAC only, so a `system:node:<name>` identity would need the Node
    authorizer. `feature_gates` (default: the control plane's, which the node must match,
    e.g. `dra_gates(version)`) go to the kubelet. The kubelet is the control plane's
    Kubernetes release (`ControlPlaneConfig.version`).
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        name: str,
        *,
        address: str = "127.0.0.2",
        labels: dict[str, str] | None = None,
        state_dir: Path | None = None,
        plugin_dir: Path | None = None,
        max_pods: int = 110,
        read_only_port: bool = True,
        exec_command_prefix: str | None = None,
        exec_path_map: dict[str, str] | None = None,
        verbosity: int = 2,
        ready_timeout_s: float = 60.0,
        feature_gates: dict[str, bool] | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.name = name
        self.address = address
        self.labels = dict(labels or {})
        self.state_dir = state_dir or control_plane.state_dir / "hollow" / name
        self.root_dir = self.state_dir / "root"
        self.plugin_dir = plugin_dir or self.root_dir / "device-plugins"
        self.log_path = self.state_dir / "hollow-node.log"
        self.max_pods = max_pods
        self.exec_command_prefix = exec_command_prefix
        self.exec_path_map = dict(exec_path_map or {})
        self.verbosity = verbosity
        self.ready_timeout_s = ready_timeout_s
        self.feature_gates = dict(
            control_plane.config.feature_gates if feature_gates is None else feature_gates
        )
        self.port = 0
        self.read_only_port = 0
        self._want_read_only_port = read_only_port
        self._process: Process | None = None
        self._log_offset = 0  # the log's size when the process last started
        self._api: k8s_client.ApiClient | None = None

    # -- paths and URLs ---------------------------------------------------------------------

    @property
    def registration_socket(self) -> Path:
        """The kubelet's device plugin Registration socket (plugins register here)."""
        return self.plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources API socket (v1 and v1alpha1 PodResourcesLister)."""
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def checkpoint_path(self) -> Path:
        """The device manager's checkpoint (next to the registration socket)."""
        return self.plugin_dir / "kubelet_internal_checkpoint"

    @property
    def plugins_registry(self) -> Path:
        """The kubelet's plugin watcher directory: a DRA plugin's registration socket
        (pluginregistration.Registration, type DRAPlugin) goes here."""
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """`<root>/plugins`, the node's /var/lib/kubelet/plugins: where DRA plugins keep
        their service sockets (`<driver>/dra.sock`). Made by `prepare`, as
        `plugins_registry`."""
        return self.root_dir / "plugins"

    @property
    def dra_checkpoint_path(self) -> Path:
        """The DRA manager's checkpoint (the prepared claims, their devices and CDI IDs)."""
        return self.root_dir / "dra_manager_state"

    @property
    def cdi_devices_dir(self) -> Path:
        """One JSON file per created container, `<pod uid>_<container>.json`: podUID,
        podNamespace, podName, containerName, cdiDevices (the CRI config's CDI device
        names, in order) and cdiAnnotations (its cdi.k8s.io/ annotations)."""
        return self.root_dir / "cdi-devices"

    @property
    def pods_url(self) -> str:
        """The read-only port's /pods (a PodList of the pods the kubelet admitted)."""
        if not self.read_only_port:
            raise HollowNodeError(f"hollow node {self.name} has no read-only port")
        return f"http://{self.address}:{self.read_only_port}/pods"

    @property
    def server_url(self) -> str:
        """The kubelet server (plain HTTP, no authentication): /healthz, /pods, /metrics, ..."""
        return f"http://{self.address}:{self.port}"

    # -- life cycle -------------------------------------------------------------------------

    def argv(self) -> list[str]:
        """The command line (ports must be chosen: `start` does)."""
        binary = find_tools((BINARY,), self.control_plane.config.version)[BINARY]
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return [
            str(binary),
            f"--kubeconfig={self.control_plane.kubeconfig_path}",
            f"--node-name={self.name}",
            f"--address={self.address}",
            f"--port={self.port}",
            f"--read-only-port={self.read_only_port}",
            f"--root-dir={self.root_dir}",
            f"--plugin-dir={self.plugin_dir}",
            f"--max-pods={self.max_pods}",
            *([f"--node-labels={labels}"] if labels else []),
            *feature_gate_args(self.feature_gates),
            *(
                [f"--exec-command-prefix={self.exec_command_prefix}"]
                if self.exec_command_prefix
                else []
            ),
            *(
                ["--exec-path-map=" + ",".join(f"{k}={v}" for k, v in self.exec_path_map.items())]
                if self.exec_path_map
                else []
            ),
            f"--v={self.verbosity}",
            "--vmodule=dra_plugin_manager=3",  # _SLICES_WIPED
            # The control plane's die_with_parent, done by the binary itself: prctl
            # between fork and exec (Process) is unsafe while gRPC threads run here.
            *(["--die-with-parent"] if self.control_plane.config.die_with_parent else []),
        ]

    def start(self) -> HollowNode:
        """Starts the process and waits until the Node is Ready (and the read-only port
        answers); HollowNodeError with the log tail when it does not."""
        if self._process is not None and self._process.running():
            return self
        self.prepare()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._process = Process(
            f"{BINARY} {self.name}", self.argv(), self.log_path, die_with_parent=False
        )
        self._process.start()
        try:
            self.wait_ready(self.ready_timeout_s)
        except (TimeoutError, ProcessExitedError) as exc:
            self._process.stop()
            raise HollowNodeError(f"hollow node {self.name} did not become Ready: {exc}") from None
        return self

    def prepare(self) -> list[str]:
        """Checks the binary and socket paths, makes the directories, picks the ports (once:
        kept across restarts, so the Node's daemon endpoint stays valid); the command line.
        A bed that manages its processes itself (the sandbox) runs that command."""
        # ToolsMissingError before anything is written
        find_tools((BINARY,), self.control_plane.config.version)
        for path in (self.registration_socket, self.pod_resources_socket):
            if len(str(path)) > _MAX_SOCKET_PATH:
                raise HollowNodeError(f"socket path too long for a unix socket: {path}")
        for directory in (self.root_dir, self.plugin_dir, self.plugins_registry, self.plugins_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.address)
            self.read_only_port = free_port(self.address) if self._want_read_only_port else 0
        return self.argv()

    def serving(self) -> bool:
        """The registration socket exists and the kubelet server answers /healthz."""
        return self.registration_socket.exists() and self._healthz()

    def wait_ready(self, timeout_s: float) -> None:
        """Waits until the Node is Ready (untainted) and, if on, the read-only port answers."""

        def ready() -> bool:
            self.check_running()
            return self.node_ready()

        wait_for(
            ready,
            timeout_s,
            f"Node {self.name} Ready (log {self.log_path})",
            describe=lambda: str(self._core().read_node(self.name).status.conditions),
        )

    def node_ready(self) -> bool:
        """The Node is registered and Ready (untainted), and the read-only port (if on)
        answers."""
        try:
            node = self._core().read_node(self.name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        if not node_ready(node):
            return False
        return not self.read_only_port or self._healthz()

    def _healthz(self) -> bool:
        url = f"http://{self.address}:{self.read_only_port or self.port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def resource_slices_wiped(self) -> bool:
        """Since the last start, the kubelet has deleted the node's ResourceSlices (it does
        once the Node is registered; a slice made before that is lost)."""
        if not self.log_path.exists():
            return False
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            return _SLICES_WIPED.encode() in log.read()

    def wait_resource_slices_wiped(self, timeout_s: float = 30.0) -> None:
        """Waits for `resource_slices_wiped` (the process must keep running)."""

        def wiped() -> bool:
            self.check_running()
            return self.resource_slices_wiped()

        wait_for(wiped, timeout_s, f"the kubelet of {self.name} to delete its ResourceSlices")

    def check_running(self) -> None:
        """Raises ProcessExitedError (with the log tail) when the process has exited."""
        if self._process is None:
            raise ProcessExitedError(f"hollow node {self.name} was never started")
        self._process.check_running()

    def running(self) -> bool:
        return self._process is not None and self._process.running()

    def stop(self, delete_node: bool = False) -> None:
        """Stops the process (SIGTERM, SIGKILL after 10 s); the root directory, the device
        checkpoint and the Node object stay unless `delete_node`."""
        if self._process is not None:
            self._process.stop()
            self._process = None
        if delete_node:
            try:
                self._core().delete_node(self.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self._close_api()

    def restart(self) -> HollowNode:
        """Stops and starts again on the same directories and ports, as a kubelet restart:
        the device manager reads its checkpoint, plugins must register again."""
        self.stop()
        return self.start()

    def remove(self) -> None:
        """Stops, deletes the Node and removes the state directory."""
        self.stop(delete_node=True)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> HollowNode:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(delete_node=True)

    # -- reading the kubelet ----------------------------------------------------------------

    def kubelet_pods(self) -> list[dict[str, Any]]:
        """The pods the kubelet holds, from the read-only port's /pods (decoded JSON)."""
        with urllib.request.urlopen(self.pods_url, timeout=5) as resp:  # noqa: S310
            items: list[dict[str, Any]] = json.load(resp).get("items") or []
            return items

    def container_cdi_devices(self, pod_uid: str, container: str) -> list[str] | None:
        """The CDI device names the kubelet passed to the runtime when it last created the
        container (DRA claims' CDI IDs, then device plugins'); None if it never did."""
        path = self.cdi_devices_dir / f"{pod_uid}_{container}.json"
        try:
            record: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        devices: list[str] = record["cdiDevices"]
        return devices

    def _core(self) -> k8s_client.CoreV1Api:
        if self._api is None:
            self._api = self.control_plane.api_client()
        return k8s_client.CoreV1Api(self._api)

    def _close_api(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
