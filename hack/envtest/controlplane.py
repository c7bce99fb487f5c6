"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and, when
asked, kube-controller-manager, kube-scheduler and KWOK.

    with ControlPlane(ControlPlaneConfig(scheduler=True)) as cp:
        api = cp.core_v1()
        ...

Every component runs in its own session and is torn down as a process group.
State (PKI, kubeconfig, etcd data, logs) lives in one directory; it is removed
after a clean stop and kept, with its path printed, after a failure.
"""

from __future__ import annotations

import shutil
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from lj_runtimekit.envtest import certs, kwok
from lj_runtimekit.envtest.process import Process, ProcessExitedError, log_tail
from lj_runtimekit.envtest.versions import find_tools, load_versions, minor
from lj_runtimekit.testkit.ports import free_port

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.128.0.0/16"


DRA_GATES: dict[str, bool] = {
    "DRAConsumableCapacity": True,
    "DRAPartitionableDevices": True,
    "DRAExtendedResource": True,
    "DRADeviceTaints": True,
}
"""The alpha DRA parts the DRA mode uses on Kubernetes 1.34 and 1.35 (beta and on by
default from 1.36): TDM slices, MIG counter sets, extended-resource mapping, device
taints."""

DRA_VERSION = load_versions().k8s_dra
"""The Kubernetes release the DRA mode is pinned to (K8S_DRA_VERSION in
hack/versions.env), where its parts are on by default: `ControlPlaneConfig(version=
DRA_VERSION, feature_gates=dra_gates(DRA_VERSION))`."""


def dra_gates(version: str) -> dict[str, bool]:
    """The feature gates the DRA mode needs on Kubernetes `version`: DRA_GATES before
    1.36, none from 1.36 on (docs/dra.md, What each Kubernetes version needs)."""
    return dict(DRA_GATES) if minor(version) < 36 else {}


def dra_runtime_config(gates: dict[str, bool]) -> list[str]:
    """The API groups the gates need served: with `DRADeviceTaints` kube-scheduler lists
    DeviceTaintRules (`resource.k8s.io/v1alpha3`, off by default in 1.34) and schedules
    nothing until that API answers."""
    if gates.get("DRADeviceTaints"):
        return ["--runtime-config=resource.k8s.io/v1alpha3=true"]
    return []


def feature_gate_args(gates: dict[str, bool]) -> list[str]:
    """`--feature-gates=A=true,B=false`, or nothing when no gate is set."""
    if not gates:
        return []
    return [
        "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))
    ]


class ControlPlaneError(RuntimeError):
    """The control plane could not start; the message names the component and its log."""


@dataclass
class ControlPlaneConfig:
    """What to start and how.

    `state_dir` None means a fresh temporary directory. `max_requests_inflight`
    is raised from the API server default (400/200) so that benchmarks and
    KWOK at scale are not throttled by the API server. `die_with_parent`
    (Linux): every component gets SIGKILL when the thread that started it
    exits, so a killed test run leaves nothing behind; start the control
    plane from a long-lived thread (the main thread) or turn it off.
    """

    controller_manager: bool = True
    scheduler: bool = True
    kwok: bool = True
    state_dir: Path | None = None
    keep_state: bool = False
    max_requests_inflight: int = 3000
    max_mutating_requests_inflight: int = 1000
    start_timeout_s: float = 90.0
    extra_apiserver_args: list[str] = field(default_factory=list)
    verbosity: int = 1
    die_with_parent: bool = True
    feature_gates: dict[str, bool] = field(default_factory=dict)
    """Feature gates given to kube-apiserver, kube-controller-manager and kube-scheduler
    alike (`dra_gates(version)`: what the DRA mode needs there, docs/dra.md)."""
    version: str | None = None
    """The Kubernetes release whose binaries run (built by hack/k8s-tools.sh): None is the
    pinned K8S_VERSION; DRA_VERSION is the DRA mode's."""
    kwok_stages: str | None = None
    """KWOK Stage documents to use instead of kwok-stages.yaml (the sandbox gates pods on
    its kubelet shim's admission)."""


def write_kubeconfig(path: Path, server: str, pki: certs.Pki, user: str = "admin") -> None:
    """An admin kubeconfig with absolute paths to the PKI files."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "envtest",
                "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki.admin_cert),
                    "client-key": str(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}],
        "current-context": "envtest",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)


class ControlPlane:
    """A started (or startable) control plane; see the module docstring."""

    def __init__(self, config: ControlPlaneConfig | None = None) -> None:
        self.config = config or ControlPlaneConfig()
        self._tmp_owned = self.config.state_dir is None
        self.state_dir = self.config.state_dir or Path(tempfile.mkdtemp(prefix="lj-envtest-"))
        self.log_dir = self.state_dir / "logs"
        self.kubeconfig_path = self.state_dir / "kubeconfig"
        self.processes: list[Process] = []
        self.pki: certs.Pki | None = None
        self.apiserver_port = 0
        self.etcd_port = 0
        self.ready_s: float = 0.0
        self._started = False
        self._ssl: ssl.SSLContext | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def server(self) -> str:
        """https URL of the API server."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    def start(self) -> ControlPlane:
        """Starts every configured component and waits until each is healthy.

        Ports are picked free just before use; when another process takes one
        in between ("address already in use"), the start is retried with new
        ports (up to three attempts).
        """
        if self._started:
            return self
        find_tools(k8s=self.config.version)  # ToolsMissingError before anything is written
        began = time.monotonic()
        for attempt in range(1, 4):
            try:
                self._start()
                break
            except (ControlPlaneError, ProcessExitedError, certs.CertificateError, OSError) as exc:
                port_clash = self._port_clash()
                self._stop_processes()
                if port_clash and attempt < 3:
                    shutil.rmtree(self.log_dir, ignore_errors=True)
                    shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
                    continue
                self.stop(failed=True)
                raise ControlPlaneError(f"{exc}\nlogs kept in {self.log_dir}") from None
            except BaseException:
                self.stop(failed=True)
                raise
        self.ready_s = time.monotonic() - began
        self._started = True
        return self

    def _port_clash(self) -> bool:
        return any("address already in use" in log_tail(p.log_path, 50) for p in self.processes)

    def _stop_processes(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    def stop(self, failed: bool = False) -> None:
        """Stops every component (reverse order). Keeps the state directory on failure."""
        self._stop_processes()
        self._started = False
        if failed or self.config.keep_state or not self._tmp_owned:
            if failed:
                print(f"envtest: control plane logs kept in {self.log_dir}", file=sys.stderr)
            return
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raises ControlPlaneError when a component has died."""
        for proc in self.processes:
            try:
                proc.check_running()
            except ProcessExitedError as exc:
                raise ControlPlaneError(str(exc)) from None

    def api_client(self) -> k8s_client.ApiClient:
        """A new ApiClient for the admin user (close it, or use it as a context manager)."""
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(
            config_file=str(self.kubeconfig_path), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 32
        return k8s_client.ApiClient(configuration)

    def kubectl_argv(self, *args: str) -> list[str]:
        """argv for kubectl against this control plane."""
        tool = find_tools(("kubectl",), self.config.version)["kubectl"]
        return [str(tool), f"--kubeconfig={self.kubeconfig_path}", *args]

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(failed=exc is not None and not isinstance(exc, KeyboardInterrupt))

    # -- start-up ---------------------------------------------------------------------------

    def _start(self) -> None:
        tools = find_tools(k8s=self.config.version)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        pki = certs.generate(self.state_dir / "pki")
        self.pki = pki
        self._ssl = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._ssl.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        deadline = time.monotonic() + self.config.start_timeout_s

        self.etcd_port = free_port()
        peer_port = free_port()
        etcd = self._spawn(
            "etcd",
            [
                str(tools["etcd"]),
                "--name=envtest",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=envtest=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait_http(etcd, f"http://127.0.0.1:{self.etcd_port}/health", deadline)

        self.apiserver_port = free_port()
        write_kubeconfig(self.kubeconfig_path, self.server, pki)
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(tools["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # A loopback advertise address cannot be a kubernetes Endpoints entry.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={self.state_dir / 'apiserver'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
                f"--requestheader-allowed-names={certs.FRONT_PROXY_CN}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_cert}",
                f"--proxy-client-key-file={pki.front_proxy_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                f"--max-requests-inflight={self.config.max_requests_inflight}",
                f"--max-mutating-requests-inflight={self.config.max_mutating_requests_inflight}",
                "--profiling=false",
                f"--v={self.config.verbosity}",
                *feature_gate_args(self.config.feature_gates),
                *dra_runtime_config(self.config.feature_gates),
                *self.config.extra_apiserver_args,
            ],
        )
        self._wait_http(apiserver, f"{self.server}/readyz", deadline)

        if self.config.controller_manager:
            port = free_port()
            kcm = self._spawn(
                "kube-controller-manager",
                [
                    str(tools["kube-controller-manager"]),
                    f"--kubeconfig={self.kubeconfig_path}",
                    f"--authentication-kubeconfig={self.kubeconfig_path}",
                    f"--authorization-kubeconfig={self.kubeconfig_path}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    f"--tls-cert-file={pki.serving_cert}",
                    f"--tls-private-key-file={pki.serving_key}",
                    f"--service-account-private-key-file={pki.sa_key}",
                    f"--root-ca-file={pki.ca_cert}",
                    f"--cluster-signing-cert-file={pki.ca_cert}",
                    f"--cluster-signing-key-file={pki.ca_key}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--use-service-account-credentials=false",
                    "--leader-elect=false",
                    "--kube-api-qps=500",
                    "--kube-api-burst=1000",
                    "--concurrent-job-syncs=10",
                    f"--v={self.config.verbosity}",
                    *feature_gate_args(self.config.feature_gates),
                ],
            )
        if self.config.scheduler:
            sched_port = free_port()
            scheduler = self._spawn("kube-scheduler", self.kube_scheduler_argv(port=sched_port))
        if self.config.kwok:
            kwok_port = free_port()
            stages = kwok.write_stages(self.state_dir / "kwok-stages.yaml", self.config.kwok_stages)
            kwok_proc = self._spawn(
                "kwok", kwok.argv(tools["kwok"], self.kubeconfig_path, stages, kwok_port, POD_CIDR)
            )
        # Health checks after all spawns: the components start in parallel.
        if self.config.controller_manager:
            self._wait_http(kcm, f"https://127.0.0.1:{port}/healthz", deadline)
        if self.config.scheduler:
            self._wait_http(scheduler, f"https://127.0.0.1:{sched_port}/healthz", deadline)
        if self.config.kwok:
            self._wait_http(kwok_proc, f"http://127.0.0.1:{kwok_port}/healthz", deadline)

    def kube_scheduler_argv(self, config_file: Path | None = None, port: int = 0) -> list[str]:
        """A kube-scheduler against this control plane: the default profile, or the
        KubeSchedulerConfiguration `config_file` (which names the kubeconfig and the leader
        election); its health port is `port` (0: a free one)."""
        assert self.pki is not None, "the control plane is not started"
        tool = find_tools(("kube-scheduler",), self.config.version)["kube-scheduler"]
        argv = [str(tool)]
        if config_file is None:
            argv += [f"--kubeconfig={self.kubeconfig_path}", "--leader-elect=false"]
        else:
            argv.append(f"--config={config_file}")
        return [
            *argv,
            f"--authentication-kubeconfig={self.kubeconfig_path}",
            f"--authorization-kubeconfig={self.kubeconfig_path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port or free_port()}",
            f"--tls-cert-file={self.pki.serving_cert}",
            f"--tls-private-key-file={self.pki.serving_key}",
            f"--v={self.config.verbosity}",
            *feature_gate_args(self.config.feature_gates),
        ]

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = Process(name, argv, self.log_dir / f"{name}.log", self.config.die_with_parent)
        proc.start()
        self.processes.append(proc)
        return proc

    def _wait_http(self, proc: Process, url: str, deadline: float) -> None:
        """Polls `url` until it answers 200 'ok'-ish, the process dies or time runs out."""
        context = self._ssl if url.startswith("https") else None
        last = "no answer yet"
        while True:
            proc.check_running()
            try:
                # url is built here from a loopback address: http or https only.
                with urllib.request.urlopen(url, timeout=2, context=context) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{proc.name} not healthy at {url} within "
                    f"{self.config.start_timeout_s:.0f}s (last: {last}); "
                    f"last lines of {proc.log_path}:\n{log_tail(proc.log_path)}"
                )
            time.sleep(0.1)
