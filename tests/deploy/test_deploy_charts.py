"""The Helm chart and the kustomizations render the plain YAML's objects; the chart applies."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit.deploy import manifests
from lj_runtimekit.deploy.components import BY_NAME, COMPONENTS, SHARED_NAMESPACES, Component
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.versions import find_tools

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import POLICIES_SERVED

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "lj-runtimekit"
Key = tuple[str, str | None, str]


def tool(name: str) -> str:
    return str(find_tools((name,))[name])


def run(*argv: str, input_text: str | None = None) -> str:
    result = subprocess.run(
        argv, input=input_text, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"{' '.join(argv)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def objects(text: str) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(text):
        if doc:
            key = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
            assert key not in out, f"{key} rendered twice"
            out[key] = doc
    return out


HELM_LABELS = (
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


def unhelmed(objs: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """The objects less the chart's standard labels, after checking every object has them
    (objects without a component name get the chart's)."""
    for key, obj in objs.items():
        labels = obj["metadata"]["labels"]
        assert set(HELM_LABELS) <= set(labels), f"{key} lacks the standard labels: {labels}"
        assert labels["app.kubernetes.io/instance"] == "lj"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        for label in HELM_LABELS:
            del labels[label]
        if labels.get("app.kubernetes.io/name") == "lj-runtimekit":
            del labels["app.kubernetes.io/name"]
        if not labels:
            del obj["metadata"]["labels"]
    return objs


SERVED = ("--kube-version", f"1.{manifests.ADMISSION_POLICIES_MINOR}.0")
"""Renders for a cluster that serves the admission policies: without a cluster Helm assumes
the pinned release, the oldest supported one under `make test-oldest-k8s`, where the chart
refuses them."""


def template(*args: str) -> dict[Key, dict[str, Any]]:
    """`helm template lj` of the chart (test hooks left out) with `args`."""
    return objects(run(tool("helm"), "template", "lj", str(CHART), "--skip-tests", *SERVED, *args))


def plain(*dirs: str) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for d in dirs:
        for path in sorted((DEPLOY / d).glob("*.yaml")):
            if path.name != "kustomization.yaml":
                out |= objects(path.read_text())
    return out


ALL = ("common", "deviceplugin", "scheduler", "exporter", "controller")


def test_helm_lint_and_template_equal_the_plain_yaml(control_plane: ControlPlane) -> None:
    helm = tool("helm")
    run(helm, "lint", "--strict", *SERVED, str(CHART))
    rendered = unhelmed(template("--namespace", "kube-system"))
    assert rendered == plain(*ALL)
    off = template(
        "--namespace",
        "kube-system",
        "--set",
        "kubeletReadOnlyPort=false,admissionPolicies.create=false,jobsNamespace=gpu-jobs",
    )
    # The Jobs policy names the Job Agent image without its tag or digest, as manifests does.
    agent = "r.example.com:5000/agent:v1@sha256:" + "a" * 64
    pinned = template("--set", f"images.job-agent={agent}")
    policy = pinned[("ValidatingAdmissionPolicy", None, "lj-runtimekit-controller-jobs")]
    name = manifests.image_name(agent)
    assert f"c.image == '{name}' ||" in policy["spec"]["validations"][0]["expression"]
    assert not [k for k in off if k[0].startswith("ValidatingAdmissionPolicy")]
    assert ("Namespace", None, "gpu-jobs") in off
    for agent in ("lj-runtimekit-device-plugin-ds", "lj-runtimekit-exporter-ds"):
        ds = off[("DaemonSet", "kube-system", agent)]
        assert "--kubelet-pods-url=" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    only_exporter = template(
        "--namespace",
        "kube-system",
        "--set",
        "components.devicePlugin=false,components.schedulerFramework=false",
        "--set",
        "components.controller=false,runtimeClass.create=false",
    )
    assert unhelmed(only_exporter) == plain("exporter")


def test_helm_refuses_admission_policies_below_1_30_and_renders_without_them(
    control_plane: ControlPlane,
) -> None:
    """The policies need admissionregistration.k8s.io/v1 (Kubernetes 1.30): for an older
    cluster the chart fails in one line naming the way out, and renders the reduced mode
    (RBAC alone) when told so."""
    argv = [tool("helm"), "template", "lj", str(CHART), "--kube-version", "1.29.0"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0, result.stdout
    assert (
        "admissionPolicies.create: Kubernetes v1.29.0 is older than 1.30: it has no"
        " ValidatingAdmissionPolicy v1 and no node name in ServiceAccount tokens; fix: upgrade"
        " the cluster, or set admissionPolicies.create=false (RBAC alone bounds the components"
        " then; deploy/README.md, Rights)"
    ) in result.stderr.splitlines()[0]
    reduced = template("--kube-version", "1.29.0", "--set", "admissionPolicies.create=false")
    assert ("Deployment", "default", "lj-runtimekit-controller") in reduced
    assert not [k for k in reduced if k[0].startswith("ValidatingAdmissionPolicy")]
    served = template("--kube-version", "1.30.0")
    assert ("ValidatingAdmissionPolicy", None, "lj-runtimekit-controller-jobs") in served


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("exporter.nodeSelectr.a=b", "additional properties 'nodeSelectr' not allowed"),
        ("tests.enabled=3", "at '/tests/enabled': got number, want boolean"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("images.exportr=x:1", "invalid propertyName 'exportr'"),
        ("imagePullSecrets[0].nam=x", "at '/imagePullSecrets/0'"),
        # The Jobs need a namespace of their own, as deploy-all.sh's --jobs-namespace.
        *(
            (
                f"jobsNamespace={ns}",
                "at '/jobsNamespace': value must be 'a namespace of the Jobs own, not one the"
                " cluster shares (default, kube-system, kube-public, kube-node-lease)",
            )
            for ns in SHARED_NAMESPACES
        ),
        ("jobsNamespace=", "at '/jobsNamespace': '' does not match pattern"),
        ("jobsNamespace=Jobs_1", "at '/jobsNamespace': 'Jobs_1' does not match pattern"),
    ],
)
def test_helm_refuses_a_bad_value(value: str, message: str, control_plane: ControlPlane) -> None:
    """values.schema.json: a typo'd key, a wrongly typed value or a shared namespace for the
    Jobs stops `helm template`."""
    argv = [tool("helm"), "template", "lj", str(CHART), "--set", value]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr
    assert "lj-runtimekit" in result.stderr


def pod(objs: dict[Key, dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = objs[(kind, "lj", name)]["spec"]["template"]
    return spec


def test_helm_pod_values(control_plane: ControlPlane, tmp_path: Path) -> None:
    """Pull secrets and policy on every pod; per component pod values replace the defaults,
    tolerations and annotations add to them; the other components keep theirs."""
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"pullPolicy": "Always"},
                "imagePullSecrets": [{"name": "regcred"}],
                "exporter": {
                    "nodeSelector": {"pool": "gpu"},
                    "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                    "affinity": {"nodeAffinity": {"x": 1}},
                    "resources": {"limits": {"memory": "1Gi"}},
                    "priorityClassName": "high",
                    "podAnnotations": {"example.com/a": "b"},
                },
            }
        )
    )
    default = template("--namespace", "lj")
    changed = template("--namespace", "lj", "-f", str(values))
    for kind, name in (
        ("DaemonSet", "lj-runtimekit-device-plugin-ds"),
        ("Deployment", "lj-runtimekit-scheduler-framework"),
        ("DaemonSet", "lj-runtimekit-exporter-ds"),
        ("Deployment", "lj-runtimekit-controller"),
    ):
        spec = pod(changed, kind, name)["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert {c["imagePullPolicy"] for c in spec["containers"]} == {"Always"}
        assert "imagePullSecrets" not in pod(default, kind, name)["spec"]
    before = pod(default, "DaemonSet", "lj-runtimekit-exporter-ds")
    after = pod(changed, "DaemonSet", "lj-runtimekit-exporter-ds")
    # Helm merges maps: the default lj_runtimekit_enable stays unless set to null.
    assert after["spec"]["nodeSelector"] == {"lj_runtimekit_enable": "true", "pool": "gpu"}
    assert after["spec"]["tolerations"] == [
        *before["spec"]["tolerations"],
        {"key": "dedicated", "operator": "Exists"},
    ]
    assert any(t["key"] == "nvidia.com/gpu" for t in after["spec"]["tolerations"])
    assert after["spec"]["affinity"] == {"nodeAffinity": {"x": 1}}
    assert after["spec"]["priorityClassName"] == "high"
    assert after["spec"]["containers"][0]["resources"]["limits"]["memory"] == "1Gi"
    assert after["metadata"]["annotations"] == {
        **before["metadata"]["annotations"],
        "example.com/a": "b",
    }
    other = pod(changed, "DaemonSet", "lj-runtimekit-device-plugin-ds")
    del other["spec"]["imagePullSecrets"]
    for container in other["spec"]["containers"]:
        container["imagePullPolicy"] = "IfNotPresent"
    assert other == pod(default, "DaemonSet", "lj-runtimekit-device-plugin-ds")


def test_helm_null_removes_a_pod_default_and_settings_take_numbers(
    control_plane: ControlPlane,
) -> None:
    """As the README says: a pod value set to null drops the default; the schema lets a
    setting be a number (`--set` parses 8 as one) and the ConfigMap holds its text."""
    rendered = template(
        *("--namespace", "lj", "--set"),
        "exporter.nodeSelector.lj_runtimekit_enable=null,exporter.priorityClassName=null",
        *("--set", "settings.controller.workers=8"),
    )
    spec = pod(rendered, "DaemonSet", "lj-runtimekit-exporter-ds")["spec"]
    assert "nodeSelector" not in spec
    assert "priorityClassName" not in spec
    config = rendered[("ConfigMap", "lj", "lj-runtimekit-controller-config")]
    assert config["data"]["workers"] == "8"


def test_helm_test_hook_and_notes(control_plane: ControlPlane) -> None:
    """`helm test` runs a pod (a test hook, deleted on success) that reads the scheduler's and
    the Exporters' /metrics; NOTES.txt says what was installed and how to verify it."""
    helm = tool("helm")
    rendered = objects(run(helm, "template", "lj", str(CHART), *SERVED, "--namespace", "lj"))
    hook = rendered[("Pod", "lj", "lj-lj-runtimekit-test")]
    assert hook["metadata"]["annotations"] == {
        "helm.sh/hook": "test",
        "helm.sh/hook-weight": "0",
        "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
    }
    container = hook["spec"]["containers"][0]
    checks = json.loads(container["command"][-1])
    assert checks == [
        ["lj-runtimekit-scheduler-framework", manifests.SCHEDULER_METRICS_PORT, True],
        ["lj-runtimekit-exporter", manifests.METRICS_PORT, False],
    ]
    compile(container["command"][2], "test-pod", "exec")
    # Its own ServiceAccount, which may only list pods (not the scheduler's, which binds and
    # deletes them), made before the pod and deleted with it.
    assert hook["spec"]["serviceAccountName"] == "lj-lj-runtimekit-test"
    hooks = {k[0]: o for k, o in rendered.items() if k[2] == "lj-lj-runtimekit-test"}
    assert set(hooks) == {"ServiceAccount", "Role", "RoleBinding", "Pod"}
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        annotations = hooks[kind]["metadata"]["annotations"]
        assert annotations == {**hook["metadata"]["annotations"], "helm.sh/hook-weight": "-1"}
    assert hooks["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert hooks["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "lj-lj-runtimekit-test", "namespace": "lj"}
    ]
    no_tests = objects(
        run(helm, "template", "lj", str(CHART), *SERVED, "-n", "lj", "--set", "tests.enabled=false")
    )
    assert not [k for k in no_tests if k[0] == "Pod"]
    policies = f"admissionPolicies.create={str(POLICIES_SERVED).lower()}"
    dry_run = ("--dry-run=client", "--kubeconfig", str(control_plane.kubeconfig_path))
    notes = run(helm, "install", "lj", str(CHART), "-n", "lj", *dry_run, "--set", policies)
    assert "LJ Runtime Kit" in notes.split("NOTES:")[1]
    assert "helm test lj -n lj" in notes
    assert "deploy-all.sh verify --namespace=lj" in notes
    assert "rollout status deployment/lj-runtimekit-controller" in notes


def test_helm_monitoring_values(control_plane: ControlPlane) -> None:
    """monitoring.*: metrics Services, ServiceMonitors and the Exporter's PrometheusRule
    (the same rules as deploy/exporter/monitoring/prometheusrule.yaml), off by default."""
    default = template("--namespace", "lj")
    assert not [k for k in default if k[0] in ("Service", "ServiceMonitor", "PrometheusRule")]
    on = template(
        "--namespace",
        "lj",
        "--set",
        "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.serviceMonitor.labels.release=prom",
    )
    for app, port in (
        ("lj-runtimekit-exporter", manifests.METRICS_PORT),
        ("lj-runtimekit-scheduler-framework", manifests.SCHEDULER_METRICS_PORT),
    ):
        service = on[("Service", "lj", f"{app}-metrics")]
        assert service["spec"]["selector"] == {"app": app}
        assert service["spec"]["ports"][0]["port"] == port
        monitor = on[("ServiceMonitor", "lj", app)]
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert monitor["spec"]["endpoints"][0]["interval"] == "30s"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["lj"]}
        labels = service["metadata"]["labels"]
        assert all(labels[k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    rule = on[("PrometheusRule", "lj", "lj-runtimekit-exporter-alerts")]
    plain_rule = yaml.safe_load(
        (DEPLOY / "exporter" / "monitoring" / "prometheusrule.yaml").read_text()
    )
    assert rule["spec"] == plain_rule["spec"]
    assert "{{ $labels" in json.dumps(rule["spec"])
    only_services = template("--namespace", "lj", "--set", "monitoring.service.enabled=true")
    assert {k[0] for k in only_services} - {k[0] for k in default} == {"Service"}


EXTENDER = "schedulerFramework.extender"
SCHEDULER_ONLY = (
    "components.devicePlugin=false,components.exporter=false,components.controller=false,"
    "runtimeClass.create=false"
)


@pytest.mark.parametrize(
    "secrets",
    [
        {"tlsSecret": "ext-tls", "clientCASecret": "ext-ca"},
        {"tlsSecret": "ext-tls", "tokenSecret": "ext-token"},
        {"tlsSecret": "ext-tls", "clientCASecret": "ext-ca", "tokenSecret": "ext-token"},
    ],
    ids=["client-ca", "token", "both"],
)
def test_helm_extender_values_render_what_lj_deploy_renders(
    secrets: dict[str, str], control_plane: ControlPlane
) -> None:
    values = ",".join(f"{EXTENDER}.{k}={v}" for k, v in secrets.items())
    rendered = unhelmed(
        template(
            "--namespace",
            "gpu-system",
            "--set",
            SCHEDULER_ONLY,
            "--set",
            f"{EXTENDER}.enabled=true,{values}",
        )
    )
    opts = dataclasses.replace(
        manifests.default_options(DEPLOY),
        namespace="gpu-system",
        extender=True,
        extender_tls_secret=secrets["tlsSecret"],
        extender_client_ca_secret=secrets.get("clientCASecret", ""),
        extender_token_secret=secrets.get("tokenSecret", ""),
    )
    expected = manifests.render((BY_NAME["scheduler-framework"],), opts, common=False)
    assert rendered == objects(manifests.dump(expected))
    assert ("Service", "gpu-system", "lj-runtimekit-scheduler-framework") in rendered
    dry_run = ("--dry-run=client", "--kubeconfig", str(control_plane.kubeconfig_path))
    notes = run(
        tool("helm"),
        "install",
        "lj",
        str(CHART),
        "-n",
        "lj",
        *dry_run,
        "--set",
        SCHEDULER_ONLY,
        "--set",
        f"{EXTENDER}.enabled=true,{values}",
    ).split("NOTES:")[1]
    assert "ConfigMap lj-runtimekit-scheduler-framework-kube-scheduler-config" in notes
    # Secrets left over with the extender off change nothing.
    off = unhelmed(template("--namespace", "kube-system", "--set", SCHEDULER_ONLY, "--set", values))
    assert off == plain("scheduler")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("", "set tlsSecret (a kubernetes.io/tls Secret)"),
        (f",{EXTENDER}.tlsSecret=t", "set clientCASecret (ca.crt"),
    ],
)
def test_helm_extender_refuses_without_tls_and_an_authenticated_caller(
    values: str, message: str, control_plane: ControlPlane
) -> None:
    result = subprocess.run(
        [
            tool("helm"),
            "template",
            "lj",
            str(CHART),
            *SERVED,
            "--set",
            f"{EXTENDER}.enabled=true{values}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert (
        "schedulerFramework.extender: the extender serves beyond loopback only with TLS and an"
        f" authenticated caller: {message}"
    ) in result.stderr


@pytest.mark.parametrize("directory", [*ALL, "."])
def test_kustomize_equals_the_plain_yaml(directory: str, control_plane: ControlPlane) -> None:
    rendered = objects(run(tool("kubectl"), "kustomize", str(DEPLOY / directory)))
    assert rendered == plain(*(ALL if directory == "." else (directory,)))


@pytest.mark.parametrize(
    "component", [c for c in COMPONENTS if c.member_config], ids=lambda c: c.name
)
def test_member_config_applies_the_deploy_objects(
    component: Component, control_plane: ControlPlane
) -> None:
    """`kubectl apply -k <Member>/config/default` gives the objects of deploy/<directory>/
    (fully qualified images included), and config/rbac/, config/manager/ and config/policy/
    split them."""
    config = ROOT / component.member / "config"
    kubectl = tool("kubectl")
    rendered = objects(run(kubectl, "kustomize", str(config / "default")))
    assert rendered == objects(run(kubectl, "kustomize", str(DEPLOY / component.directory)))
    assert rendered == plain(component.directory)
    rbac = objects(run(kubectl, "kustomize", str(config / "rbac")))
    manager = objects(run(kubectl, "kustomize", str(config / "manager")))
    policy = objects(run(kubectl, "kustomize", str(config / "policy")))
    assert {kind for kind, _, _ in rbac} == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    }
    assert {kind for kind, _, _ in manager} == {"ConfigMap", component.kind, "PodDisruptionBudget"}
    assert {kind for kind, _, _ in policy} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    assert rbac | manager | policy == rendered


def test_helm_output_applies_to_the_api_server(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "chart.yaml"
    manifest.write_text(
        run(
            tool("helm"),
            "template",
            "lj",
            str(CHART),
            "--skip-tests",
            "--namespace",
            namespace,
            "--set",
            "image.registry=registry.example.com/lj,images.exporter=exp:1",
            "--set",
            f"jobsNamespace={namespace}-jobs",
            "--set",
            f"admissionPolicies.create={str(POLICIES_SERVED).lower()}",
        )
    )
    kubectl = control_plane.kubectl_argv()
    # A server-side dry run needs the namespaces of the objects to exist.
    run(*kubectl, "create", "namespace", f"{namespace}-jobs")
    run(*kubectl, "apply", "--server-side", "--dry-run=server", "-f", str(manifest))
    try:
        out = run(*kubectl, "apply", "--server-side", "-f", str(manifest))
        assert "daemonset.apps/lj-runtimekit-exporter-ds serverside-applied" in out
        image = run(
            *kubectl,
            "-n",
            namespace,
            "get",
            "ds/lj-runtimekit-device-plugin-ds",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        )
        version = (ROOT / "VERSION").read_text().strip()
        assert image == f"registry.example.com/lj/lj-runtimekit-device-plugin:{version}"
        exporter = run(
            *kubectl,
            "-n",
            namespace,
            "get",
            "ds/lj-runtimekit-exporter-ds",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        )
        assert exporter == "exp:1"
    finally:
        run(*kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", str(manifest))


def test_helm_adopts_a_deploy_all_install(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """The README's steps: a plain install (what deploy-all.sh applies), annotated and
    labelled for the release, is taken over by `helm install` with matching values."""
    kubectl = control_plane.kubectl_argv()
    jobs = f"{namespace}-jobs"
    version = (ROOT / "VERSION").read_text().strip()
    manifest = tmp_path / "plain.yaml"
    policies = [] if POLICIES_SERVED else ["--no-admission-policies"]
    run(
        *(sys.executable, "-m", "lj_runtimekit.deploy", "render"),
        *("--protocol", str(DEPLOY / "protocol.yaml"), "--version", version),
        *("--namespace", namespace, "--jobs-namespace", jobs, "-o", str(manifest), *policies),
    )
    helm = (tool("helm"), "--kubeconfig", str(control_plane.kubeconfig_path), "-n", namespace)
    apply = ("apply", "--server-side", "--field-manager=lj-runtimekit-deploy")
    run(*kubectl, *apply, "-f", str(manifest))
    try:
        release = ("meta.helm.sh/release-name=lj", f"meta.helm.sh/release-namespace={namespace}")
        run(*kubectl, "annotate", "--overwrite", "-f", str(manifest), *release)
        managed = "app.kubernetes.io/managed-by=Helm"
        run(*kubectl, "label", "--overwrite", "-f", str(manifest), managed)
        values = f"jobsNamespace={jobs},admissionPolicies.create={str(POLICIES_SERVED).lower()}"
        run(*helm, "install", "lj", str(CHART), "--set", values)
        instance = run(
            *kubectl,
            *("-n", namespace, "get", "ds/lj-runtimekit-exporter-ds", "-o"),
            r"jsonpath={.metadata.labels.app\.kubernetes\.io/instance}",
        )
        assert instance == "lj"
        assert "deployed" in run(*helm, "status", "lj")
    finally:
        subprocess.run([*helm, "uninstall", "lj", "--wait=false"], capture_output=True, check=False)
        run(*kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", str(manifest))


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()
        self.wfile.write(b"# HELP up\n")

    def log_message(self, *args: Any) -> None:
        pass


def test_helm_test_pod_script_reads_metrics_through_the_api(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """The hook pod's script, run here as the hook's own ServiceAccount (its Role applied)
    against the real API server: it finds the scheduler pod by label and reads its /metrics
    (a local server at the pod's IP); once the server is gone it fails, naming the pod.
    That ServiceAccount may list pods and nothing else."""
    kubectl = control_plane.kubectl_argv()
    assert control_plane.pki is not None
    rbac = tmp_path / "rbac.yaml"
    hook = objects(
        run(tool("helm"), "template", "lj", str(CHART), *SERVED, "--namespace", namespace)
    )
    test_account = "lj-lj-runtimekit-test"
    kinds = ("ServiceAccount", "Role", "RoleBinding")
    rbac.write_text(
        yaml.safe_dump_all([o for k, o in hook.items() if k[0] in kinds and k[2] == test_account])
    )
    run(*kubectl, "apply", "-f", str(rbac))
    user = f"system:serviceaccount:{namespace}:{test_account}"
    for verb, resource, allowed in (
        ("list", "pods", "yes"),
        ("get", "pods", "no"),
        ("delete", "pods", "no"),
        ("create", "pods/binding", "no"),
        ("patch", "pods/status", "no"),
        ("list", "secrets", "no"),
    ):
        can_i = subprocess.run(
            [*kubectl, "-n", namespace, "auth", "can-i", verb, resource, f"--as={user}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert can_i.stdout.strip() == allowed, (verb, resource, can_i.stdout, can_i.stderr)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        app = "lj-runtimekit-scheduler-framework"
        pod_manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "scheduler", "namespace": namespace, "labels": {"app": app}},
            # Placed nowhere, so that only this test sets its status.
            "spec": {
                "nodeSelector": {"lj-test/nowhere": "true"},
                "containers": [{"name": "c", "image": "scheduler:1"}],
            },
        }
        run(*kubectl, "create", "-f", "-", input_text=json.dumps(pod_manifest))
        status = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
        run(
            *(*kubectl, "-n", namespace, "patch", "pod", "scheduler", "--subresource=status"),
            *("--type=merge", "-p", json.dumps({"status": status})),
        )
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        token = run(*kubectl, "-n", namespace, "create", "token", test_account)
        (sa / "token").write_text(token.strip())
        (sa / "namespace").write_text(namespace)
        (sa / "ca.crt").write_bytes(control_plane.pki.ca_cert.read_bytes())
        command = hook[("Pod", namespace, "lj-lj-runtimekit-test")]["spec"]["containers"][0][
            "command"
        ]
        script = command[2].replace("/var/run/secrets/kubernetes.io/serviceaccount", str(sa))
        host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
        env = {**os.environ, "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
        checks = json.dumps([[app, server.server_address[1], True], ["lj-none", 1, False]])

        def hook_run() -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, "-c", script, checks]
            return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

        ok = hook_run()
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"ok   scheduler http://127.0.0.1:{server.server_address[1]}/metrics" in ok.stdout
        server.shutdown()
        server.server_close()
        failed = hook_run()
        assert failed.returncode == 1
        assert "FAIL scheduler" in failed.stdout
    finally:
        server.server_close()
        run(*kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", str(rbac))
