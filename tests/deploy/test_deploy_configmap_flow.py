"""The operator's protocol ConfigMap flow on the real control plane, word for word: edit the
three protocol ConfigMaps (kubectl edit), `deploy-all.sh deploy` refuses to replace them,
`kubectl rollout restart`, wait for the rollout, `deploy-all.sh verify` passes and reports the
new hash from every component; before the restart verify names the pods on the old hash.

KWOK runs no container, so each pod's process is stood in for by the component's own code
given the ConfigMap's protocol.yaml as the pod mounts it: a real Exporter and a real
scheduler serving /metrics (read with --metrics-url=POD=URL), and the Device Plugin's
startup report on its Node (`protocolinfo.annotate_node`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.proto.pkg import protocolinfo
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol.constants import parse_protocol
from lj_runtimekit.runtimesim.process import SimulatorProcess
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess
from lj_runtimekit.testkit.waits import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import ROOT, WORKLOADS, Env

pytestmark = pytest.mark.controlplane

PROTOCOL_WORKLOADS = {c: WORKLOADS[c] for c in ("device-plugin", "scheduler-framework", "exporter")}
OLD, NEW = (
    "annotations.gpu_policy: lingjun.com/gpu-policy",
    "annotations.gpu_policy: example.com/gpu-policy",
)


def sha_of(text: str) -> str:
    return protocolinfo.protocol_sha256(parse_protocol(yaml.safe_load(text), "test"))


class Pods:
    """What runs in each pod of the protocol components: the component's code, started
    with the protocol.yaml of its ConfigMap at the moment the pod is (re)started."""

    def __init__(self, env: Env, work: Path, sockets: Path) -> None:
        self.env = env
        self.work = work
        self.sockets = sockets
        self.procs: dict[str, subprocess.Popen[bytes] | SchedulerProcess] = {}
        self.urls: dict[str, str] = {}

    def running(self, component: str) -> list[dict[str, Any]]:
        out = self.env.k(
            "get",
            "pods",
            f"--namespace={self.env.namespace}",
            "-l",
            f"app=lj-runtimekit-{component}",
            "-o",
            "json",
        ).stdout
        return [
            p
            for p in json.loads(out)["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    def protocol_file(self, component: str) -> Path:
        cm = self.env.get("configmap", f"lj-runtimekit-{component}-config")
        assert cm is not None
        text = cm["data"]["protocol.yaml"]
        path = self.work / f"{component}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
        path.write_text(text)
        return path

    def start(self) -> None:
        """Start what each pod not yet started runs; stop what a gone pod ran."""
        live: set[str] = set()
        for component in PROTOCOL_WORKLOADS:
            protocol = self.protocol_file(component)
            for pod in self.running(component):
                name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
                live.add(name)
                if name in self.procs or name in self.urls:
                    continue
                if component == "device-plugin":
                    self.report_node(node, protocol)
                    self.urls[name] = ""
                elif component == "exporter":
                    self.start_exporter(name, node, protocol)
                else:
                    self.start_scheduler(name, protocol)
        for name in set(self.procs) | set(self.urls):
            if name not in live:
                self.stop(name)
        for name, url in self.urls.items():
            if url:
                wait_for(
                    lambda u=url: self.serving(u),
                    60,
                    f"{name}'s stand-in to serve {url}",
                    describe=lambda n=name: self.log(n),
                )

    def report_node(self, node: str, protocol: Path) -> None:
        """The Device Plugin's startup report (cmd/device-plugin/main.py)."""
        kube = KubeClient.connect(str(self.env.cp.kubeconfig_path))
        loaded = parse_protocol(yaml.safe_load(protocol.read_text()), str(protocol))
        assert asyncio.run(protocolinfo.annotate_node(kube, node, loaded))

    def start_exporter(self, pod: str, node: str, protocol: Path) -> None:
        port = free_port()
        with (self.work / f"{pod}.log").open("wb") as log:
            self.procs[pod] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "lj_runtimekit.exporter.cmd.exporter.main",
                    f"--runtime-socket-dir={self.sockets}",
                    f"--port={port}",
                    "--listen-address=127.0.0.1",
                    f"--node-name={node}",
                    "--kubelet-pods-url=http://127.0.0.1:9/pods",
                    "--apiserver-fallback=off",
                    f"--protocol-file={protocol}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.urls[pod] = f"http://127.0.0.1:{port}/metrics"

    def start_scheduler(self, pod: str, protocol: Path) -> None:
        port = free_port("0.0.0.0")
        self.procs[pod] = SchedulerProcess(
            self.env.cp.kubeconfig_path,
            f"cm-flow-{secrets.token_hex(3)}",
            f"--metrics-port={port}",
            f"--protocol-file={protocol}",
        ).start()
        self.urls[pod] = f"http://127.0.0.1:{port}/metrics"

    def serving(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return protocolinfo.METRIC in answer.read().decode()
        except OSError:
            return False

    def log(self, name: str) -> str:
        proc = self.procs.get(name)
        if isinstance(proc, SchedulerProcess):
            return proc.text()[-3000:]
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        self.urls.pop(name, None)
        if isinstance(proc, SchedulerProcess):
            proc.stop()
        elif proc is not None:
            proc.terminate()
            proc.wait(timeout=10)

    def metrics_args(self) -> list[str]:
        return [f"--metrics-url={pod}={url}" for pod, url in sorted(self.urls.items()) if url]


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    api = control_plane.api_client()
    core = k8s_client.CoreV1Api(api)
    namespace = f"lj-cmflow-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": namespace}})
    nodes = NodeFactory(api, group=namespace)
    for i in range(2):
        nodes.create(f"{namespace}-gpu-{i}", gpus=8)
    env = Env(control_plane, namespace, tmp_path_factory.mktemp("cmflow"))
    yield env
    env.run("delete", "--keep-node-state")
    nodes.cleanup()
    core.delete_namespace(namespace, propagation_policy="Background")
    api.close()


@pytest.fixture(scope="module")
def pods(env: Env) -> Iterator[Pods]:
    work = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    sockets = work / "sockets"
    sockets.mkdir()
    node = ROOT / "hack/runtime-sim/examples/nodes/tdm-8gpu.yaml"
    with SimulatorProcess(sockets, node):
        standing = Pods(env, work, sockets)
        try:
            yield standing
        finally:
            for name in list(standing.procs):
                standing.stop(name)


def configmap_text(env: Env, component: str) -> str:
    cm = env.get("configmap", f"lj-runtimekit-{component}-config")
    assert cm is not None
    text: str = cm["data"]["protocol.yaml"]
    return text


def test_edit_refused_deploy_restart_verify(env: Env, pods: Pods) -> None:
    env.ok("deploy")
    pods.start()
    source = (ROOT / "deploy/protocol.yaml").read_text()
    out = env.ok("verify", *pods.metrics_args())
    for component in PROTOCOL_WORKLOADS:
        assert f"{component}: " in out
        cm = f"lj-runtimekit-{component}-config (sha256 {sha_of(source)[:12]})"
        assert f"run the protocol of ConfigMap {cm}" in out

    # The operator edits the three ConfigMaps with kubectl edit.
    editor = f"sed -i {shlex.quote(f's#{OLD}#{NEW}#')}"
    for component in PROTOCOL_WORKLOADS:
        result = subprocess.run(
            [
                env.kubectl,
                f"--kubeconfig={env.cp.kubeconfig_path}",
                "edit",
                "configmap",
                f"lj-runtimekit-{component}-config",
                f"--namespace={env.namespace}",
            ],
            env={**os.environ, "KUBE_EDITOR": editor},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert NEW in configmap_text(env, component)
    edited = sha_of(source.replace(OLD, NEW))

    # Not restarted: verify names the pods on the old hash, and suggests no revert.
    result = env.run("verify", *pods.metrics_args())
    assert result.returncode == 1, result.stdout
    problems = [line for line in result.stdout.splitlines() if "PROBLEM" in line]
    for component in PROTOCOL_WORKLOADS:
        names = [p["metadata"]["name"] for p in pods.running(component)]
        line = next(p for p in problems if f"PROBLEM {component}: pod(s)" in p)
        for name in names:
            assert f"{env.namespace}/{name} (sha256 {sha_of(source)[:12]})" in line
        assert f"kubectl -n {env.namespace} rollout restart" in line
    assert not [p for p in problems if "deploy-all.sh deploy" in p or "drift" in p]
    assert (
        "info    the live protocol differs from deploy/protocol.yaml: annotations.gpu_policy"
        in result.stdout
    )

    # deploy refuses to replace the edit, naming the ConfigMaps, the keys and the choices.
    result = env.run("deploy")
    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error) == 1, result.stderr
    for component in PROTOCOL_WORKLOADS:
        assert (
            f"ConfigMap {env.namespace}/lj-runtimekit-{component}-config"
            " (keys protocol.yaml (annotations.gpu_policy))"
        ) in error[0]
        assert NEW in configmap_text(env, component)
    assert "--keep-live-config" in error[0]
    assert "--overwrite-config" in error[0]

    # kubectl rollout restart, wait for the rollout: the pods start on the edited files.
    for kind, name in PROTOCOL_WORKLOADS.values():
        env.k("rollout", "restart", f"{kind}/{name}", f"--namespace={env.namespace}")
    for kind, name in PROTOCOL_WORKLOADS.values():
        env.k(
            "rollout", "status", f"{kind}/{name}", f"--namespace={env.namespace}", "--timeout=90s"
        )
    pods.start()
    out = env.ok("verify", *pods.metrics_args())
    for component in PROTOCOL_WORKLOADS:
        assert (
            f"run the protocol of ConfigMap lj-runtimekit-{component}-config (sha256 {edited[:12]})"
        ) in out
    assert "verify passed" in out

    # Redeploying keeps the edit when asked: the ConfigMaps hold it, verify passes.
    env.ok("deploy", "--keep-live-config")
    for component in PROTOCOL_WORKLOADS:
        assert NEW in configmap_text(env, component)
    pods.start()
    out = env.ok("verify", *pods.metrics_args())
    assert f"(sha256 {edited[:12]})" in out


def test_rendered_values_are_named_until_a_deploy_and_overwrite_goes_back(
    env: Env, pods: Pods
) -> None:
    amd_old = "resources.amd: alibabacloud.com/amd-gpu"
    amd_new = "resources.amd: example.com/amd-gpu"
    for component in PROTOCOL_WORKLOADS:
        text = configmap_text(env, component).replace(amd_old, amd_new)
        patch = json.dumps({"data": {"protocol.yaml": text}})
        cm = f"lj-runtimekit-{component}-config"
        env.k("patch", "configmap", cm, f"--namespace={env.namespace}", "-p", patch)
    for kind, name in PROTOCOL_WORKLOADS.values():
        env.k("rollout", "restart", f"{kind}/{name}", f"--namespace={env.namespace}")
    for kind, name in PROTOCOL_WORKLOADS.values():
        env.k("rollout", "status", f"{kind}/{name}", f"--namespace={env.namespace}")
    pods.start()

    # The pods run the edit, but the DaemonSets' tolerations were rendered before it.
    result = env.run("verify", *pods.metrics_args())
    assert result.returncode == 1
    problems = [line for line in result.stdout.splitlines() if "PROBLEM" in line]
    fix = f"fix: deploy-all.sh deploy --keep-live-config --namespace={env.namespace}"
    assert problems == [
        f"PROBLEM {c}: DaemonSet {env.namespace}/{WORKLOADS[c][1]} no toleration of"
        " example.com/amd-gpu (resources.amd): rendered at deploy time from another protocol,"
        f" a ConfigMap edit cannot change it; {fix}"
        for c in ("device-plugin", "exporter")
    ], result.stdout

    env.ok("deploy", "--keep-live-config")
    daemonset = env.get("daemonset", WORKLOADS["exporter"][1])
    assert daemonset is not None
    tolerated = {t["key"] for t in daemonset["spec"]["template"]["spec"]["tolerations"]}
    assert "example.com/amd-gpu" in tolerated
    pods.start()
    assert "verify passed" in env.ok("verify", *pods.metrics_args())

    # Kept once, asked again; --overwrite-config goes back to deploy/protocol.yaml.
    refused = env.run("deploy")
    assert refused.returncode == 1
    assert "--keep-live-config" in refused.stderr
    env.ok("deploy", "--overwrite-config")
    source = (ROOT / "deploy/protocol.yaml").read_text()
    for component in PROTOCOL_WORKLOADS:
        assert configmap_text(env, component) == source
    pods.start()
    out = env.ok("verify", *pods.metrics_args())
    assert f"(sha256 {sha_of(source)[:12]})" in out
    assert "the live protocol differs" not in out
    # The edit ran in the pods: rollback puts it back (the Controller never changed).
    env.ok("rollback", f"--components={','.join(PROTOCOL_WORKLOADS)}")
    for component in PROTOCOL_WORKLOADS:
        assert amd_new in configmap_text(env, component)
