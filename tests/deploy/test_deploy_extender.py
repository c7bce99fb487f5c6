"""The extender option on a real control plane: deploy-all.sh deploys it (the API server
takes every object), and the real kube-scheduler, started with the rendered configuration,
binds a pod through the extender run as the rendered Deployment runs it."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from lj_runtimekit.deploy import manifests
from lj_runtimekit.deploy.components import BY_NAME, CONFIG_DIR
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.envtest.process import Process
from lj_runtimekit.envtest.versions import find_tools
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess, annotate_inventory
from lj_runtimekit.testkit.scheduler.process import bound_pods as bound
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import POLICIES_SERVED

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "deploy-all.sh"
SCHEDULER = BY_NAME["scheduler-framework"]
P = load_protocol()


class Deployer:
    """deploy-all.sh with the extender option, for the scheduler alone, in `namespace`."""

    def __init__(self, cp: ControlPlane, namespace: str, tmp: Path) -> None:
        self.env = dict(
            os.environ,
            KUBECTL=str(find_tools(("kubectl",))["kubectl"]),
            KUBECONFIG=str(cp.kubeconfig_path),
            LJ_DEPLOY_LOG_DIR=str(tmp / "logs"),
        )
        self.args = [
            "--components=scheduler-framework",
            f"--namespace={namespace}",
            "--extender",
            "--extender-tls-secret=extender-tls",
            "--extender-client-ca-secret=extender-client-ca",
            "--timeout=120s",
            *(() if POLICIES_SERVED else ("--no-admission-policies",)),
        ]

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), command, *self.args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


@pytest.fixture
def deployed(
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    tmp_path: Path,
) -> Iterator[tuple[Deployer, str]]:
    """The scheduler deployed with the extender option, and a GPU node (the scheduler's
    pod runs there, and the test's pod goes there)."""
    pki = control_plane.pki
    assert pki is not None
    core = k8s_client.CoreV1Api(api_client)
    # The Secrets an operator makes: the extender's serving certificate (here the control
    # plane's, which names 127.0.0.1) and the CA of the kube-scheduler's client certificate.
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "extender-tls"},
            "type": "kubernetes.io/tls",
            "stringData": {
                "tls.crt": pki.serving_cert.read_text(),
                "tls.key": pki.serving_key.read_text(),
            },
        },
    )
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "extender-client-ca"},
            "stringData": {"ca.crt": pki.ca_cert.read_text()},
        },
    )
    node = node_factory.create(f"{namespace}-n0")
    annotate_inventory(core, node)
    deployer = Deployer(control_plane, namespace, tmp_path)
    result = deployer.run("deploy")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    yield deployer, node
    result = deployer.run("delete")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"


def _local_extender(
    control_plane: ControlPlane, core: k8s_client.CoreV1Api, deployment: Any, work: Path
) -> tuple[list[str], dict[str, str], int]:
    """The deployed container's command line, its mounted ConfigMap and Secrets written
    under `work`, its environment; the extender on a free port (no Service routing here)."""
    namespace = deployment.metadata.namespace
    spec = deployment.spec.template.spec
    (container,) = spec.containers
    paths: dict[str, Path] = {}
    for volume in spec.volumes:
        mount = next(m for m in container.volume_mounts if m.name == volume.name)
        local = work / volume.name
        local.mkdir()
        if volume.config_map is not None:
            data = core.read_namespaced_config_map(volume.config_map.name, namespace).data
        else:
            secret = core.read_namespaced_secret(volume.secret.secret_name, namespace)
            data = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
        for key, value in data.items():
            (local / key).write_text(value)
        paths[mount.mount_path] = local
    port = free_port()
    args = []
    for arg in container.args:
        for mount_path, local in paths.items():
            arg = arg.replace(f"={mount_path}/", f"={local}/")
        if arg.startswith("--extender-port="):
            arg = f"--extender-port={port}"
        if arg.startswith("--metrics-port="):
            arg = "--metrics-port=0"
        args.append(arg)
    assert any(a.startswith(f"--config={paths[CONFIG_DIR]}/") for a in args), args
    env = {"LJ_SCHEDULER_LEASE_NAMESPACE": namespace}
    return args, env, port


def test_deployed_extender_is_called_by_the_kube_scheduler_with_the_rendered_config(
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    deployed: tuple[Deployer, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pki = control_plane.pki
    assert pki is not None
    core = k8s_client.CoreV1Api(api_client)
    apps = k8s_client.AppsV1Api(api_client)
    service = core.read_namespaced_service(SCHEDULER.app, namespace)
    assert service.spec.ports[0].port == manifests.EXTENDER_PORT
    deployment = apps.read_namespaced_deployment(SCHEDULER.workload, namespace)
    assert "--mode=extender" in deployment.spec.template.spec.containers[0].args
    # What the kube-scheduler keeps (the PodScheduled condition, preemption, gangs) is not
    # granted in extender mode.
    authz = k8s_client.AuthorizationV1Api(api_client)

    def allowed(verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
        attributes = {"verb": verb, "group": group, "resource": resource, "namespace": "default"}
        review = authz.create_subject_access_review(
            {
                "spec": {
                    "user": f"system:serviceaccount:{namespace}:{SCHEDULER.service_account}",
                    "resourceAttributes": {**attributes, "subresource": subresource},
                }
            }
        )
        return bool(review.status.allowed)

    assert allowed("create", "pods", subresource="binding")
    assert allowed("watch", "nodes")
    assert not allowed("patch", "pods", subresource="status")
    assert not allowed("delete", "pods")
    assert not allowed("list", "poddisruptionbudgets", "policy")
    assert not allowed("get", "jobsets", "jobset.x-k8s.io")

    # The extender, run as the Deployment runs it (the control plane's nodes run no
    # containers): its command line, files and rights (its ServiceAccount's token: the
    # extender-mode ClusterRole is enough), listening beyond loopback with TLS and client
    # certificates.
    args, env, port = _local_extender(control_plane, core, deployment, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    token = core.create_namespaced_service_account_token(
        SCHEDULER.service_account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    kubeconfig = yaml.safe_load(control_plane.kubeconfig_path.read_text())
    kubeconfig["users"][0]["user"] = {"token": token}
    (tmp_path / "extender.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    extender = SchedulerProcess(tmp_path / "extender.kubeconfig", manifests.SCHEDULER_NAME, *args)
    extender.start()
    try:
        wait_for(
            lambda: "extender serving" in extender.text(),
            60,
            "extender serving",
            describe=extender.text,
        )

        # The kube-scheduler with the rendered configuration; what an operator sets for
        # their kube-scheduler's host: its kubeconfig, the client certificate files, and
        # here the address (no cluster DNS) and a profile name beside the control
        # plane's own default-scheduler.
        cm = core.read_namespaced_config_map(
            manifests.kube_scheduler_configmap(SCHEDULER), namespace
        )
        config = yaml.safe_load(cm.data[manifests.KUBE_SCHEDULER_CONFIG_KEY])
        (ext,) = config["extenders"]
        assert ext["urlPrefix"] == f"https://{SCHEDULER.app}.{namespace}.svc:8888"
        name = f"ext-{namespace}"
        config["clientConnection"]["kubeconfig"] = str(control_plane.kubeconfig_path)
        config["leaderElection"] = {"leaderElect": False}
        config["profiles"][0]["schedulerName"] = name
        ext["urlPrefix"] = f"https://127.0.0.1:{port}"
        ext["tlsConfig"] = {
            "certFile": str(pki.admin_cert),
            "keyFile": str(pki.admin_key),
            "caFile": str(pki.ca_cert),
        }
        (tmp_path / "kube-scheduler.yaml").write_text(yaml.safe_dump(config))
        kube_scheduler = Process(
            "kube-scheduler",
            control_plane.kube_scheduler_argv(tmp_path / "kube-scheduler.yaml"),
            tmp_path / "kube-scheduler.log",
        )
        kube_scheduler.start()
        try:
            core.create_namespaced_pod(
                namespace, pod("w0", name, node_factory.selector, {P.resources.gpu: "2"})
            )
            wait_for(
                lambda: "w0" in bound(core, namespace),
                90,
                "the kube-scheduler binds through the deployed extender",
                describe=lambda: (
                    (tmp_path / "kube-scheduler.log").read_text()[-3000:] + extender.text()[-2000:]
                ),
            )
            # Only the extender's bind writes the devices chosen.
            annotations = bound(core, namespace)["w0"].metadata.annotations
            assert P.annotations.assigned_devices in annotations
            assert "forbidden" not in extender.text().lower()
        finally:
            kube_scheduler.stop()
    finally:
        extender.stop()
