"""The operator's edits of the plain YAML under deploy/<component>/ are what deploy applies
(`lj-deploy render --deploy-dir`, which deploy-all.sh deploy and upgrade call): each edited
field is set on the objects rendered with the options, an option setting the same field wins
and says so, and what cannot be applied soundly is refused in one line naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit.deploy import cli
from lj_runtimekit.deploy.components import CHECKSUM_ANNOTATION
from lj_runtimekit.deploy.manifests import config_checksum, image_name

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import VERSION, copy_checkout

REGISTRY = "lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit"
DP_IMAGE = f"{REGISTRY}/lj-runtimekit-device-plugin:{VERSION}"
DAEMONSET = "deploy/deviceplugin/03-daemonset.yaml"
CONFIGMAP = "deploy/deviceplugin/02-configmap.yaml"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    return copy_checkout(tmp_path / "checkout")


def edit(checkout: Path, file: str, old: str, new: str) -> None:
    path = checkout / file
    text = path.read_text()
    assert old in text, f"{old!r} not in {file}"
    path.write_text(text.replace(old, new))


def render(
    checkout: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[dict[str, Any]], str, str]:
    """lj-deploy render with the checkout's files: exit code, objects, stdout, stderr."""
    out = checkout / "rendered.yaml"
    code = cli.main(
        [
            "render",
            f"--protocol={checkout / 'deploy/protocol.yaml'}",
            f"--version={VERSION}",
            f"--deploy-dir={checkout / 'deploy'}",
            f"--output={out}",
            *args,
        ]
    )
    captured = capsys.readouterr()
    objs = [d for d in yaml.safe_load_all(out.read_text()) if d] if code == 0 else []
    return code, objs, captured.out, captured.err


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def container(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = find(objs, kind, name)["spec"]["template"]["spec"]["containers"][0]
    return found


def test_unedited_files_render_exactly_what_the_options_render(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in ((), ("--namespace=gpu-ops", "--version=v9.9.9", "--no-admission-policies")):
        code, with_files, out, _ = render(checkout, capsys, *args)
        assert code == 0
        assert out == ""
        plain = checkout / "plain.yaml"
        assert (
            cli.main(
                [
                    "render",
                    f"--protocol={checkout / 'deploy/protocol.yaml'}",
                    f"--version={VERSION}",
                    f"--output={plain}",
                    *args,
                ]
            )
            == 0
        )
        assert with_files == [d for d in yaml.safe_load_all(plain.read_text()) if d]


def test_an_edited_image_and_limit_are_applied_with_the_namespace_option(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(checkout, DAEMONSET, f"image: {DP_IMAGE}", "image: registry.example.com/dp:v1.15.1")
    edit(checkout, DAEMONSET, "memory: 256Mi", "memory: 300Mi")
    code, objs, out, _ = render(checkout, capsys, "--namespace=gpu-ops")
    assert code == 0
    dp = container(objs, "DaemonSet", "lj-runtimekit-device-plugin-ds")
    assert dp["image"] == "registry.example.com/dp:v1.15.1"
    assert dp["resources"]["limits"]["memory"] == "300Mi"
    assert find(objs, "DaemonSet", "lj-runtimekit-device-plugin-ds")["metadata"]["namespace"] == (
        "gpu-ops"
    )
    assert out.splitlines() == [
        f"applying your edit of {DAEMONSET}: DaemonSet lj-runtimekit-device-plugin-ds"
        ' spec.template.spec.containers[0].image = "registry.example.com/dp:v1.15.1"',
        f"applying your edit of {DAEMONSET}: DaemonSet lj-runtimekit-device-plugin-ds"
        ' spec.template.spec.containers[0].resources.limits.memory = "300Mi"',
    ]
    # Only the edited fields: the exporter keeps its rendered image.
    exporter = container(objs, "DaemonSet", "lj-runtimekit-exporter-ds")
    assert exporter["image"] == f"{REGISTRY}/lj-runtimekit-exporter:{VERSION}"


@pytest.mark.parametrize(
    "option", ["--version=v9.9.9", "--image=device-plugin=other.example.com/dp:v2.0.0"]
)
def test_an_option_setting_the_edited_field_wins_and_says_so(
    checkout: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    edit(checkout, DAEMONSET, f"image: {DP_IMAGE}", "image: registry.example.com/dp:v1.15.1")
    edit(checkout, DAEMONSET, "memory: 256Mi", "memory: 300Mi")
    code, objs, out, _ = render(checkout, capsys, "--workloads-only", option)
    assert code == 0
    dp = container(objs, "DaemonSet", "lj-runtimekit-device-plugin-ds")
    wanted = option.split("=")[-1] if "--image" in option else DP_IMAGE.replace(VERSION, "v9.9.9")
    assert dp["image"] == wanted
    assert dp["resources"]["limits"]["memory"] == "300Mi"
    assert (
        f"warning: {DAEMONSET}: DaemonSet lj-runtimekit-device-plugin-ds"
        ' spec.template.spec.containers[0].image: your edit "registry.example.com/dp:v1.15.1"'
        f' is not applied: the options set it ("{wanted}")'
    ) in out.splitlines()


def test_a_configmap_setting_edit_changes_the_pod_template_checksum(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, before, _, _ = render(checkout, capsys, "--components=device-plugin")
    edit(checkout, CONFIGMAP, "log-level: INFO", "log-level: DEBUG")
    code, objs, out, _ = render(checkout, capsys, "--components=device-plugin")
    assert code == 0
    data = find(objs, "ConfigMap", "lj-runtimekit-device-plugin-config")["data"]
    assert data["log-level"] == "DEBUG"
    template = find(objs, "DaemonSet", "lj-runtimekit-device-plugin-ds")["spec"]["template"]
    checksum = template["metadata"]["annotations"][CHECKSUM_ANNOTATION]
    old = find(before, "DaemonSet", "lj-runtimekit-device-plugin-ds")["spec"]["template"]
    assert checksum == config_checksum(data)
    assert checksum != old["metadata"]["annotations"][CHECKSUM_ANNOTATION]
    assert "data.log-level" in out


def test_an_edited_job_agent_image_reaches_the_admission_policy(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = f"{REGISTRY}/lj-runtimekit-controller-job-agent:{VERSION}"
    edit(
        checkout,
        "deploy/controller/03-deployment.yaml",
        f"--job-image={agent}",
        "--job-image=mirror.example.com/agent:v1.15.1",
    )
    code, objs, _, _ = render(checkout, capsys, "--components=controller")
    assert code == 0
    args = container(objs, "Deployment", "lj-runtimekit-controller")["args"]
    assert "--job-image=mirror.example.com/agent:v1.15.1" in args
    policy = json.dumps(find(objs, "ValidatingAdmissionPolicy", "lj-runtimekit-controller-jobs"))
    assert image_name("mirror.example.com/agent:v1.15.1") in policy
    assert image_name(agent) not in policy


def test_a_change_of_deploy_protocol_yaml_is_not_taken_for_an_edit_of_the_files(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = checkout / "deploy/protocol.yaml"
    text = source.read_text().replace("lingjun.com/gpu-policy", "example.com/gpu-policy")
    source.write_text(text)
    code, objs, out, _ = render(checkout, capsys)
    assert code == 0
    assert out == ""
    for name in ("device-plugin", "scheduler-framework", "exporter"):
        assert find(objs, "ConfigMap", f"lj-runtimekit-{name}-config")["data"]["protocol.yaml"] == (
            text
        )


def test_an_edited_kustomization_is_said_not_to_be_applied(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(checkout, "deploy/deviceplugin/kustomization.yaml", f"newTag: {VERSION}", "newTag: v2")
    code, _, out, _ = render(checkout, capsys, "--components=device-plugin")
    assert code == 0
    assert out.startswith(
        "warning: deploy/deviceplugin/kustomization.yaml is not applied by deploy-all.sh"
        " (kubectl apply -k reads it)"
    )


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        (
            CONFIGMAP,
            "resources.gpu: alibabacloud.com/gpu",
            "resources.gpu: example.com/gpu",
            f"{CONFIGMAP}: key protocol.yaml differs from deploy/protocol.yaml, the one source",
        ),
        (
            DAEMONSET,
            "name: lj-runtimekit-device-plugin-ds",
            "name: my-device-plugin",
            f"{DAEMONSET}: holds DaemonSet my-device-plugin, deploy renders DaemonSet"
            " lj-runtimekit-device-plugin-ds; deploy applies edits to the fields of its objects",
        ),
        (DAEMONSET, "apiVersion: apps/v1", "apiVersion: [apps", f"{DAEMONSET}: not valid YAML"),
        (DAEMONSET, "", "", f"{DAEMONSET} is missing"),
    ],
)
def test_what_cannot_be_applied_is_refused_in_one_line_naming_the_file(
    checkout: Path, capsys: pytest.CaptureFixture[str], file: str, old: str, new: str, message: str
) -> None:
    if old:
        edit(checkout, file, old, new)
    else:
        (checkout / file).unlink()
    code, _, _, err = render(checkout, capsys)
    assert code == 1
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {message}"), err
    assert "Traceback" not in err


def _deploy_all_without_kubectl(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """deploy-all.sh ARGS in `checkout`, with a kubectl that does not exist."""
    return subprocess.run(
        ["bash", str(checkout / "deploy/deploy-all.sh"), *args],
        env={
            **os.environ,
            "LJ_DEPLOY_PYTHON": sys.executable,
            "LJ_DEPLOY_LOG_DIR": str(checkout / "logs"),
            "KUBECTL": "/nonexistent/kubectl",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_deploy_all_refuses_before_contacting_the_cluster(checkout: Path) -> None:
    edit(checkout, DAEMONSET, "name: lj-runtimekit-device-plugin-ds", "name: my-device-plugin")
    result = _deploy_all_without_kubectl(checkout, "deploy", "--components=device-plugin")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1
    assert f"error: {DAEMONSET}: holds DaemonSet my-device-plugin" in errors[0]
    # status reads the cluster only: the files are not its business.
    status = _deploy_all_without_kubectl(checkout, "status")
    assert "kubectl not found" in status.stderr


def test_an_edit_of_an_object_an_option_leaves_out_is_said_not_applied(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(
        checkout,
        "deploy/deviceplugin/04-admission.yaml",
        "failurePolicy: Fail",
        "failurePolicy: Ignore",
    )
    code, objs, out, _ = render(checkout, capsys, "--no-admission-policies")
    assert code == 0
    assert not [o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert out.startswith(
        "warning: deploy/deviceplugin/04-admission.yaml: ValidatingAdmissionPolicy"
    )
    assert 'your edit "Ignore" is not applied: the options leave this object out' in out
