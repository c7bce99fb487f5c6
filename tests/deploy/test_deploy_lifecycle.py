"""deploy-all.sh against the real control plane: deploy, status, verify, drift, stale
resources, upgrade, rollback, delete. One deployed state for the module, tests in order."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
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

from lj_runtimekit.deploy import manifests
from lj_runtimekit.deploy.components import CHECKSUM_ANNOTATION, COMPONENTS
from lj_runtimekit.deploy.verify import PREVIOUS_DATA_ANNOTATION
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.envtest.versions import find_tools, load_versions
from lj_runtimekit.runtimesim.process import SimulatorProcess
from lj_runtimekit.testkit.controller import GROUP_LABEL, STATE, OperatorProcess
from lj_runtimekit.testkit.waits import wait_for

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "deploy-all.sh"
VERSION = (ROOT / "VERSION").read_text().strip()
ENABLE = "lj_runtimekit_enable"
WORKLOADS = {
    "device-plugin": ("daemonset", "lj-runtimekit-device-plugin-ds"),
    "scheduler-framework": ("deployment", "lj-runtimekit-scheduler-framework"),
    "exporter": ("daemonset", "lj-runtimekit-exporter-ds"),
    "controller": ("deployment", "lj-runtimekit-controller"),
}


def copy_checkout(dest: Path) -> Path:
    """A checkout's deploy files (deploy-all.sh, protocol.yaml, the plain YAML) and VERSION
    under `dest`, for a test that edits them as an operator does; returns `dest`."""
    deploy = dest / "deploy"
    deploy.mkdir(parents=True)
    shutil.copy(ROOT / "VERSION", dest / "VERSION")
    for name in ("deploy-all.sh", "protocol.yaml", "kustomization.yaml"):
        shutil.copy(ROOT / "deploy" / name, deploy / name)
    for directory in ("common", *(c.directory for c in COMPONENTS)):
        shutil.copytree(ROOT / "deploy" / directory, deploy / directory)
    return dest


# Against a server older than the admission policies (docs/compatibility.md) the
# deploy leaves them out.
POLICIES_SERVED = load_versions().k8s_minor >= manifests.ADMISSION_POLICIES_MINOR
CLUSTER_OBJECTS = [
    ("runtimeclass", "lj-runtime"),
    ("priorityclass", "lj-runtimekit-node-agent"),
    *(
        (kind, f"lj-runtimekit-{c}")
        for c in WORKLOADS
        for kind in ("clusterrole", "clusterrolebinding")
    ),
    *(
        (kind, name)
        for name in (
            "lj-runtimekit-controller-jobs",
            "lj-runtimekit-controller-nodes",
            "lj-runtimekit-device-plugin-own-node",
            "lj-runtimekit-exporter-own-node",
        )
        for kind in ("validatingadmissionpolicy", "validatingadmissionpolicybinding")
        if POLICIES_SERVED
    ),
]


class Env:
    """The module's namespace, nodes and a runner of deploy-all.sh."""

    def __init__(self, cp: ControlPlane, namespace: str, tmp: Path) -> None:
        self.cp = cp
        self.namespace = namespace
        self.jobs_namespace = f"{namespace}-jobs"
        self.kubectl = str(find_tools(("kubectl",))["kubectl"])
        self.deleted = False
        self.env = dict(
            os.environ,
            KUBECTL=self.kubectl,
            KUBECONFIG=str(cp.kubeconfig_path),
            LJ_DEPLOY_LOG_DIR=str(tmp / "logs"),
        )

    def run_args(self, *args: str) -> list[str]:
        """The options every command of this install takes (`args` may set --timeout)."""
        return [
            f"--namespace={self.namespace}",
            f"--jobs-namespace={self.jobs_namespace}",
            *(() if any(a.startswith("--timeout=") for a in args) else ("--timeout=90s",)),
            *(() if POLICIES_SERVED else ("--no-admission-policies",)),
        ]

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        argv = ["bash", str(SCRIPT), *args, *self.run_args(*args)]
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
        return result.stdout

    def k(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.kubectl, f"--kubeconfig={self.cp.kubeconfig_path}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert result.returncode == 0, f"kubectl {args}: {result.stderr}"
        return result

    def get(self, kind: str, name: str, namespaced: bool = True) -> dict[str, Any] | None:
        ns = [f"--namespace={self.namespace}"] if namespaced else []
        result = self.k("get", kind, name, "-o", "json", *ns, check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def live(self) -> dict[tuple[str, str], tuple[str, int]]:
        """(kind, name) -> (resourceVersion, generation) of every object of the deployment."""
        selector = "app.kubernetes.io/part-of=lj-runtimekit"
        namespaced = (
            "serviceaccounts,configmaps,daemonsets,deployments,roles,rolebindings,"
            "poddisruptionbudgets"
        )
        cluster = "clusterroles,clusterrolebindings,priorityclasses,runtimeclasses,namespaces"
        if POLICIES_SERVED:
            cluster += ",validatingadmissionpolicies,validatingadmissionpolicybindings"
        items = []
        for kinds, ns in (
            (namespaced, [f"--namespace={self.namespace}"]),
            ("roles,rolebindings", ["--namespace=default"]),  # the Controller's node events
            # The Controller's Jobs, their pods and its Lease; the Job Agent's account.
            ("serviceaccounts,roles,rolebindings", [f"--namespace={self.jobs_namespace}"]),
            (cluster, []),
        ):
            out = self.k("get", kinds, "-l", selector, "-o", "json", *ns).stdout
            items += json.loads(out)["items"]
        return {
            (i["kind"], i["metadata"]["name"]): (
                i["metadata"]["resourceVersion"],
                i["metadata"].get("generation", 0),
            )
            for i in items
        }

    def images(self, component: str) -> list[str]:
        kind, name = WORKLOADS[component]
        obj = self.get(kind, name)
        assert obj is not None
        return [c["image"] for c in obj["spec"]["template"]["spec"]["containers"]]


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    api = control_plane.api_client()
    core = k8s_client.CoreV1Api(api)
    namespace = f"lj-deploy-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": namespace}})
    nodes = NodeFactory(api, group=namespace)
    for i in range(2):
        nodes.create(f"{namespace}-gpu-{i}", gpus=8)
    nodes.create(f"{namespace}-cpu", gpus=0, enable=False)
    env = Env(control_plane, namespace, tmp_path_factory.mktemp("deploy"))
    yield env
    if not env.deleted:
        env.run("delete")
    nodes.cleanup()
    core.delete_namespace(namespace, propagation_policy="Background")
    api.close()


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[str]:
    """The real Exporter on a Runtime simulator: what `verify --metrics-url` reads."""
    work = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    sockets = work / "sockets"
    sockets.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = ROOT / "hack/runtime-sim/examples/nodes/tdm-8gpu.yaml"
    with SimulatorProcess(sockets, node), (work / "exporter.log").open("wb") as log:
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit.exporter.cmd.exporter.main",
                f"--runtime-socket-dir={sockets}",
                f"--port={port}",
                "--listen-address=127.0.0.1",
                "--node-name=gpu-0",
                "--kubelet-pods-url=http://127.0.0.1:9/pods",
                "--apiserver-fallback=off",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2):
                    return True
            except OSError:
                assert exporter.poll() is None, (work / "exporter.log").read_text()
                return False

        try:
            wait_for(serving, 30, "the exporter to serve /healthz")
            yield url + "/metrics"
        finally:
            exporter.terminate()
            exporter.wait(timeout=10)
    shutil.rmtree(work, ignore_errors=True)


def test_precheck_passes_with_labelled_nodes(env: Env) -> None:
    out = env.ok("precheck")
    assert "Kubernetes v1." in out
    assert "ok      gang scheduling needs no JobSet" in out
    assert "node(s) labelled lj_runtimekit_enable=true" in out
    assert "precheck passed" in out


def test_dry_run_validates_on_the_server_and_creates_nothing(env: Env) -> None:
    out = env.ok("deploy", "--dry-run")
    assert "dry run: the API server accepted every object" in out
    assert "log file: " in out
    for kind, name in WORKLOADS.values():
        assert env.get(kind, name) is None


def test_components_deploys_only_the_device_plugin_onto_enabled_gpu_nodes(env: Env) -> None:
    out = env.ok("deploy", "--components=device-plugin")
    assert env.get("daemonset", "lj-runtimekit-device-plugin-ds") is not None
    assert env.get("deployment", "lj-runtimekit-controller") is None
    assert env.get("configmap", "lj-runtimekit-exporter-config") is None
    assert env.get("runtimeclass", "lj-runtime", namespaced=False) is not None
    pods = json.loads(
        env.k(
            "get",
            "pods",
            f"--namespace={env.namespace}",
            "-l",
            "app=lj-runtimekit-device-plugin",
            "-o",
            "json",
        ).stdout
    )["items"]
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    assert nodes == [f"{env.namespace}-gpu-0", f"{env.namespace}-gpu-1"]
    assert "device-plugin" in out
    assert "2/2 ready" in out


def test_deploy_creates_every_object_and_is_idempotent(env: Env) -> None:
    assert env.get("namespace", env.jobs_namespace, namespaced=False) is None
    out = env.ok("deploy")
    # The Jobs' namespace is created first, so kubectl diff compares the objects in it.
    assert "could not compare" not in out
    assert "object(s) differ (diff in the log)" in out
    rendered = {
        (d["kind"], env.jobs_namespace if d["kind"] == "Namespace" else d["metadata"]["name"])
        for f in sorted((ROOT / "deploy").glob("*/0*.yaml"))
        if f.parent.name != "draplugin"  # deployed only with --dra
        for d in yaml.safe_load_all(f.read_text())
        if d and (POLICIES_SERVED or not d["kind"].startswith("ValidatingAdmissionPolicy"))
    }
    first = env.live()
    assert rendered <= set(first), f"not created: {rendered - set(first)}"
    again = env.ok("deploy")
    assert "no change: every object is already as rendered" in again
    second = env.live()
    for key in rendered:
        # Workloads and policies (type checking): status updates move the resourceVersion;
        # the spec's generation must stay.
        field = 1 if key[0] in {"DaemonSet", "Deployment", "ValidatingAdmissionPolicy"} else 0
        assert second[key][field] == first[key][field], f"{key} changed"


# (service account, verb, resource, subresource, namespace or None for cluster-wide, allowed);
# namespace "@" is the install namespace, "jobs" the Controller's Jobs' namespace.
ACCESS = [
    ("device-plugin", "patch", "nodes", "", None, True),
    ("device-plugin", "list", "pods", "", None, True),
    ("device-plugin", "patch", "pods", "", "default", True),
    ("device-plugin", "delete", "pods", "", "default", False),
    ("device-plugin", "watch", "pods", "", None, True),
    ("device-plugin", "update", "pods", "", "default", False),
    ("device-plugin", "create", "jobs", "", "@", False),
    ("exporter", "list", "pods", "", None, True),
    ("exporter", "watch", "pods", "", None, True),
    ("exporter", "patch", "nodes", "", None, False),
    ("exporter", "get", "secrets", "", "@", False),
    ("scheduler-framework", "create", "pods", "binding", "default", True),
    ("scheduler-framework", "patch", "pods", "status", "default", True),
    ("scheduler-framework", "update", "pods", "status", "default", False),
    ("exporter", "patch", "pods", "status", "default", False),
    ("scheduler-framework", "watch", "nodes", "", None, True),
    ("scheduler-framework", "get", "jobsets", "", "default", True),
    ("scheduler-framework", "create", "leases", "", "@", True),
    ("scheduler-framework", "update", "leases", "", "default", False),
    ("scheduler-framework", "patch", "nodes", "", None, False),
    ("scheduler-framework", "delete", "pods", "", "default", True),  # preemption victims
    ("scheduler-framework", "list", "poddisruptionbudgets", "", None, True),
    ("scheduler-framework", "watch", "poddisruptionbudgets", "", None, False),  # a list only
    ("scheduler-framework", "update", "poddisruptionbudgets", "", "default", False),
    ("scheduler-framework", "watch", "resourceslices", "", None, True),
    ("scheduler-framework", "update", "resourceslices", "", None, False),  # the driver's
    ("scheduler-framework", "watch", "deviceclasses", "", None, True),
    ("scheduler-framework", "watch", "resourceclaims", "", None, True),
    ("scheduler-framework", "update", "resourceclaims", "", "default", True),  # its finalizer
    ("scheduler-framework", "update", "resourceclaims", "status", "default", True),
    ("scheduler-framework", "delete", "resourceclaims", "", "default", False),
    ("scheduler-framework", "create", "resourceclaims", "", "default", False),
    ("controller", "create", "jobs", "", "jobs", True),
    ("controller", "create", "jobs", "", "@", False),
    ("controller", "create", "jobs", "", "default", False),
    ("controller", "list", "pods", "", "jobs", True),
    ("controller", "list", "pods", "", "@", False),
    ("controller", "create", "events", "", "default", True),
    ("controller", "create", "events", "", "@", False),
    ("controller", "update", "leases", "", "jobs", True),
    ("controller", "update", "leases", "", "@", False),
    ("controller", "patch", "nodes", "", None, True),
    ("controller", "create", "pods", "binding", "default", False),
    ("job-agent", "get", "nodes", "", None, False),
]


def test_rbac_grants_what_each_component_calls_and_nothing_more(env: Env) -> None:
    api = env.cp.api_client()
    try:
        authz = k8s_client.AuthorizationV1Api(api)
        wrong = []
        for account, verb, resource, sub, ns, allowed in ACCESS:
            namespace = {"@": env.namespace, "jobs": env.jobs_namespace}.get(ns or "", ns)
            lease = {"scheduler-framework": "lj-runtimekit-scheduler-framework"}.get(
                account, "lj-runtimekit-controller"
            )
            group = {
                "jobs": "batch",
                "leases": "coordination.k8s.io",
                "jobsets": "jobset.x-k8s.io",
                "poddisruptionbudgets": "policy",
                "resourceslices": "resource.k8s.io",
                "deviceclasses": "resource.k8s.io",
                "resourceclaims": "resource.k8s.io",
            }.get(resource, "")
            review = authz.create_subject_access_review(
                {
                    "spec": {
                        "user": f"system:serviceaccount:{env.namespace}:lj-runtimekit-{account}",
                        "resourceAttributes": {
                            "verb": verb,
                            "group": group,
                            "resource": resource,
                            "subresource": sub,
                            "namespace": namespace or "",
                            "name": lease if resource == "leases" and verb == "update" else "",
                        },
                    }
                }
            )
            if review.status.allowed != allowed:
                wrong.append((account, verb, resource, sub, namespace, review.status.allowed))
        assert wrong == []
    finally:
        api.close()


def test_status_and_verify_report_the_pods_on_the_gpu_nodes(env: Env, metrics_url: str) -> None:
    status = env.ok("status")
    for component, (_, name) in WORKLOADS.items():
        assert component in status
        assert name in status
    assert f"node={env.namespace}-gpu-0" in status
    out = env.ok("verify", f"--metrics-url={metrics_url}")
    assert f"node {env.namespace}-gpu-0: capacity matches" in out
    assert "protocol ConfigMaps agree" in out
    assert "# HELP/# TYPE" in out
    assert "verify passed" in out


def test_verify_reports_configmap_drift_key_by_key_and_deploy_heals_it(
    env: Env, metrics_url: str
) -> None:
    cm = env.get("configmap", "lj-runtimekit-exporter-config")
    assert cm is not None
    text = cm["data"]["protocol.yaml"].replace(
        "resources.gpu: alibabacloud.com/gpu\n", "resources.gpu: example.com/gpu\n"
    )
    patch = json.dumps({"data": {"protocol.yaml": text}})
    env.k(
        "patch",
        "configmap",
        "lj-runtimekit-exporter-config",
        f"--namespace={env.namespace}",
        "-p",
        patch,
    )
    result = env.run("verify", f"--metrics-url={metrics_url}")
    assert result.returncode == 1
    assert "protocol ConfigMaps disagree: resources.gpu:" in result.stdout
    assert "exporter=example.com/gpu" in result.stdout
    assert "device-plugin=alibabacloud.com/gpu" in result.stdout
    assert (
        "reports no protocol (metrics not read) and lj-runtimekit-exporter-config changed after"
        " its pod template was rendered"
    ) in result.stdout
    # deploy replaces an edit only when told to (test_deploy_configmap_flow: the choices).
    refused = env.run("deploy", "--components=exporter")
    assert refused.returncode == 1
    assert "--overwrite-config" in refused.stderr
    env.ok("deploy", "--components=exporter", "--overwrite-config")
    healed = env.get("configmap", "lj-runtimekit-exporter-config")
    assert healed is not None
    assert healed["data"]["protocol.yaml"] == (ROOT / "deploy/protocol.yaml").read_text()
    # The edit never ran in a pod: not recorded as the configuration a rollback restores.
    recorded = (healed["metadata"].get("annotations") or {}).get(PREVIOUS_DATA_ANNOTATION, "")
    assert "example.com/gpu" not in recorded


def test_stale_resource_is_reported_and_cleaned_up(env: Env, metrics_url: str) -> None:
    node = f"{env.namespace}-gpu-1"
    patch = json.dumps(
        {
            "status": {
                "capacity": {"alibabacloud.com/gpu-old": "8"},
                "allocatable": {"alibabacloud.com/gpu-old": "0"},
            }
        }
    )
    env.k("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)
    result = env.run("verify", f"--metrics-url={metrics_url}")
    assert result.returncode == 1
    assert f"node {node}: stale resource(s) alibabacloud.com/gpu-old" in result.stdout
    env.ok("cleanup-stale-resources")
    live = env.get("node", node, namespaced=False)
    assert live is not None
    assert "alibabacloud.com/gpu-old" not in live["status"]["capacity"]
    assert "alibabacloud.com/gpu-old" not in live["status"]["allocatable"]


def test_upgrade_sets_the_images_and_rollback_restores_them(env: Env) -> None:
    before = {c: env.images(c) for c in WORKLOADS}
    assert before["exporter"] == [
        f"lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit/lj-runtimekit-exporter:{VERSION}"
    ]
    out = env.ok("upgrade", "--version=v9.9.9")
    for component in WORKLOADS:
        assert all(i.endswith(":v9.9.9") for i in env.images(component)), component
        assert f"upgraded {component}:" in out
    ctrl = env.get("deployment", "lj-runtimekit-controller")
    assert ctrl is not None
    args = ctrl["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any(a.endswith("lj-runtimekit-controller-job-agent:v9.9.9") for a in args)
    out = env.ok("rollback")
    assert {c: env.images(c) for c in WORKLOADS} == before
    assert "rolled back exporter:" in out
    # a second rollback undoes the first (as for the ConfigMaps), a third the second
    env.ok("rollback")
    assert all(i.endswith(":v9.9.9") for i in env.images("exporter"))
    env.ok("rollback")
    assert {c: env.images(c) for c in WORKLOADS} == before


def test_rollback_restores_the_configuration_of_the_release_before(
    env: Env, tmp_path: Path
) -> None:
    # A newer release: its own checkout, whose protocol.yaml differs (a comment).
    release = copy_checkout(tmp_path / "release")
    source = (ROOT / "deploy/protocol.yaml").read_text()
    (release / "deploy/protocol.yaml").write_text(source + "# next release\n")
    newer = subprocess.run(
        ["bash", str(release / "deploy/deploy-all.sh"), "deploy", *env.run_args()],
        env={**env.env, "LJ_DEPLOY_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert newer.returncode == 0, newer.stdout + newer.stderr
    cm = env.get("configmap", "lj-runtimekit-exporter-config")
    assert cm is not None
    assert cm["data"]["protocol.yaml"].endswith("# next release\n")
    controller_images = env.images("controller")
    out = env.ok("rollback")
    assert "rolled back ConfigMap lj-runtimekit-exporter-config: data checksum" in out
    # the newer release did not change the Controller: it stays (one revision back would be
    # the upgrade's v9.9.9 of the test before)
    assert "controller: the last deploy or upgrade did not change it" in out
    assert env.images("controller") == controller_images
    for component, (kind, name) in WORKLOADS.items():
        cm = env.get("configmap", f"lj-runtimekit-{component}-config")
        workload = env.get(kind, name)
        assert cm is not None
        assert workload is not None
        if component != "controller":
            assert cm["data"]["protocol.yaml"] == source, component
        template = workload["spec"]["template"]["metadata"]["annotations"]
        assert template[CHECKSUM_ANNOTATION] == manifests.config_checksum(cm["data"]), component


def test_a_second_install_in_another_namespace_is_refused_and_its_delete_keeps_the_first(
    env: Env, tmp_path: Path
) -> None:
    other = Env(env.cp, f"{env.namespace}-b", tmp_path)
    result = other.run("deploy")
    assert result.returncode == 1
    assert (
        f"the Runtime Kit is already installed in namespace {env.namespace} "
        "(its ClusterRoleBindings name it)"
    ) in result.stderr
    assert other.get("namespace", other.namespace, namespaced=False) is None
    binding = env.get("clusterrolebinding", "lj-runtimekit-controller", namespaced=False)
    assert binding is not None
    assert {s["namespace"] for s in binding["subjects"]} == {env.namespace}
    out = other.ok("delete")
    assert f"belong to the install in namespace {env.namespace}: kept" in out
    for kind, name in CLUSTER_OBJECTS:
        assert env.get(kind, name, namespaced=False) is not None, f"{kind}/{name} removed"
    for kind, name in WORKLOADS.values():
        assert env.get(kind, name) is not None


def _state(env: Env, node: str) -> str | None:
    live = env.get("node", node, namespaced=False)
    assert live is not None
    return (live["metadata"].get("annotations") or {}).get(STATE)


def test_delete_says_why_a_node_is_not_disabled_and_keeps_the_install(env: Env) -> None:
    node = f"{env.namespace}-gpu-0"
    enabled = json.dumps(
        {"metadata": {"labels": {STATE: "enabled"}, "annotations": {STATE: "enabled"}}}
    )
    env.k("patch", "node", node, "--type=merge", "-p", enabled)  # as the Controller leaves it
    result = env.run("delete", "--timeout=3s")
    assert result.returncode == 1
    assert f"not disabled within 3s: {node} enabled" in result.stderr
    for kind, name in WORKLOADS.values():
        assert env.get(kind, name) is not None
    # Back to labelled, never enabled: the next test's Controller enables them.
    for i in range(2):
        patch = {
            "metadata": {"labels": {ENABLE: "true", STATE: None}, "annotations": {STATE: None}}
        }
        env.k("patch", "node", f"{env.namespace}-gpu-{i}", "--type=merge", "-p", json.dumps(patch))


def test_delete_disables_the_nodes_then_removes_everything_it_created(
    env: Env, tmp_path: Path
) -> None:
    gpu = [f"{env.namespace}-gpu-{i}" for i in range(2)]
    controller = OperatorProcess(  # the real Controller (KWOK runs no container)
        env.cp.kubeconfig_path,
        env.jobs_namespace,
        tmp_path / "controller.log",
        node_selector=f"{GROUP_LABEL}={env.namespace}",
    ).start()
    try:
        for node in gpu:
            wait_for(lambda n=node: _state(env, n) == "enabled", 90, f"{node} enabled")
        out = env.ok("delete")
    except BaseException:
        print(controller.log()[-20000:])
        raise
    finally:
        controller.stop()
    env.deleted = True
    assert "disabled 2 node(s)" in out
    assert "removed the Runtime Kit's labels and annotations from 2 node(s)" in out
    for node in gpu:
        live = env.get("node", node, namespaced=False)
        assert live is not None
        meta = live["metadata"]
        left = [
            k
            for k in [*meta.get("labels", {}), *(meta.get("annotations") or {})]
            if k == ENABLE or k.startswith(("lj-runtimekit.io/", "lingjun.com/"))
        ]
        assert left == [], node
    for name, ns in (
        ("lj-runtimekit-scheduler-framework", env.namespace),
        ("lj-runtimekit-controller", env.jobs_namespace),
    ):
        assert env.k("get", "lease", name, "-n", ns, check=False).returncode != 0, name
    for kind, name in WORKLOADS.values():
        assert env.get(kind, name) is None
    for component in WORKLOADS:
        assert env.get("configmap", f"lj-runtimekit-{component}-config") is None
        assert env.get("serviceaccount", f"lj-runtimekit-{component}") is None
    for kind, name in CLUSTER_OBJECTS:
        assert env.get(kind, name, namespaced=False) is None, f"{kind}/{name} left behind"
    for kind in ("role", "rolebinding"):
        name = "lj-runtimekit-controller-node-events"
        assert env.k("get", kind, name, "-n", "default", check=False).returncode != 0
    jobs = env.get("namespace", env.jobs_namespace, namespaced=False)
    assert jobs is None or jobs["status"]["phase"] == "Terminating"

    def no_pods() -> bool:
        out = env.k("get", "pods", f"--namespace={env.namespace}", "-o", "name").stdout
        return not out.strip()

    wait_for(no_pods, 60, "the component pods to go away")
