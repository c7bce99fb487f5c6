"""The Helm chart and the kustomizations render the plain YAML's objects; the chart applies."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit.deploy import manifests
from lj_runtimekit.deploy.components import COMPONENTS, Component
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.versions import find_tools, load_versions

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "lj-runtimekit"
Key = tuple[str, str | None, str]

POLICIES_SERVED = load_versions().k8s_minor >= manifests.ADMISSION_POLICIES_MINOR


def tool(name: str) -> str:
    return str(find_tools((name,))[name])


def run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
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
    run(helm, "lint", "--strict", str(CHART))
    rendered = objects(run(helm, "template", "lj", str(CHART), "--namespace", "kube-system"))
    assert rendered == plain(*ALL)
    off = objects(
        run(
            helm,
            "template",
            "lj",
            str(CHART),
            "--namespace",
            "kube-system",
            "--set",
            "kubeletReadOnlyPort=false,admissionPolicies.create=false,jobsNamespace=gpu-jobs",
        )
    )
    # The Jobs policy names the Job Agent image without its tag or digest, as manifests does.
    agent = "r.example.com:5000/agent:v1@sha256:" + "a" * 64
    pinned = objects(run(helm, "template", "lj", str(CHART), "--set", f"images.job-agent={agent}"))
    policy = pinned[("ValidatingAdmissionPolicy", None, "lj-runtimekit-controller-jobs")]
    name = manifests.image_name(agent)
    assert f"c.image == '{name}' ||" in policy["spec"]["validations"][0]["expression"]
    assert not [k for k in off if k[0].startswith("ValidatingAdmissionPolicy")]
    assert ("Namespace", None, "gpu-jobs") in off
    for agent in ("lj-runtimekit-device-plugin-ds", "lj-runtimekit-exporter-ds"):
        ds = off[("DaemonSet", "kube-system", agent)]
        assert "--kubelet-pods-url=" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    only_exporter = objects(
        run(
            helm,
            "template",
            "lj",
            str(CHART),
            "--namespace",
            "kube-system",
            "--set",
            "components.devicePlugin=false,components.schedulerFramework=false",
            "--set",
            "components.controller=false,runtimeClass.create=false",
        )
    )
    assert only_exporter == plain("exporter")


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
