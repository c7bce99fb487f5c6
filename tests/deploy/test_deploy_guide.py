"""The deployment guide's upgrade, rollback and configuration change on the real control plane,
word for word: the commands of deploy/README.md (Editing the files) run in a copy of the
checkout after the edit an operator makes to deploy/deviceplugin/, and the edit takes effect.

The test install's options (`--namespace`, `--jobs-namespace`, `--timeout`) are added to each
deploy-all.sh command and its namespace stands for `kube-system`, as in every deploy test."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.deploy.components import CHECKSUM_ANNOTATION
from lj_runtimekit.deploy.manifests import config_checksum
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import ROOT, VERSION, Env, copy_checkout

pytestmark = pytest.mark.controlplane

DAEMONSET = "lj-runtimekit-device-plugin-ds"
OLD_IMAGE = (
    "lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit/"
    f"lj-runtimekit-device-plugin:{VERSION}"
)
NEW_IMAGE = OLD_IMAGE.rsplit(":", 1)[0] + ":v99.0.1"


def guide_steps() -> dict[str, list[str]]:
    """The guide's commands in deploy/README.md, by the step their comment opens."""
    text = (ROOT / "deploy/README.md").read_text()
    section = text.split("## Editing the files: upgrade, rollback, a configuration change", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    steps: dict[str, list[str]] = {}
    step = ""
    for line in block.group(1).splitlines():
        if header := re.match(r"# ([A-Z][\w ]*): ", line):
            step = header.group(1)
            steps[step] = []
        elif line and not line.startswith("#"):
            steps[step].append(line)
    return steps


class Operator:
    """Runs the guide's commands in the checkout, as an operator's shell would."""

    def __init__(self, env: Env, checkout: Path) -> None:
        self.env = env
        self.checkout = checkout
        self.shell_env = {
            **env.env,
            "PATH": f"{Path(env.kubectl).parent}{os.pathsep}{os.environ['PATH']}",
            "LJ_DEPLOY_PYTHON": sys.executable,
        }

    def edit(self, file: str, old: str, new: str) -> None:
        path = self.checkout / file
        text = path.read_text()
        assert text.count(old) == 1, f"{old!r} in {file}"
        path.write_text(text.replace(old, new))

    def play(self, commands: list[str]) -> str:
        out = ""
        for command in commands:
            command = command.replace("kube-system", self.env.namespace)
            if command.startswith("./deploy/deploy-all.sh"):
                command += " " + " ".join(self.env.run_args())
            result = subprocess.run(
                ["bash", "-c", command],
                cwd=self.checkout,
                env=self.shell_env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
            out += result.stdout
        return out


def pods(env: Env) -> list[dict[str, Any]]:
    selector = "app=lj-runtimekit-device-plugin"
    out = env.k("get", "pods", f"--namespace={env.namespace}", "-l", selector, "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    api = control_plane.api_client()
    core = k8s_client.CoreV1Api(api)
    namespace = f"lj-guide-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": namespace}})
    nodes = NodeFactory(api, group=namespace)
    for i in range(2):
        nodes.create(f"{namespace}-gpu-{i}", gpus=8)
    tmp = tmp_path_factory.mktemp("guide")
    env = Env(control_plane, namespace, tmp)
    yield Operator(env, copy_checkout(tmp / "checkout"))
    env.run("delete", "--keep-node-state")
    nodes.cleanup()
    core.delete_namespace(namespace, propagation_policy="Background")
    api.close()


def test_the_guides_upgrade_rollback_and_configuration_change_take_effect(
    operator: Operator,
) -> None:
    env = operator.env
    steps = guide_steps()
    assert list(steps) == ["Upgrade", "Rollback", "A configuration change"]
    assert "deploy done" in env.ok("deploy", "--components=device-plugin")
    assert env.images("device-plugin") == [OLD_IMAGE]

    # Upgrade: the new tag in deploy/deviceplugin/03-daemonset.yaml.
    operator.edit("deploy/deviceplugin/03-daemonset.yaml", OLD_IMAGE, NEW_IMAGE)
    out = operator.play(steps["Upgrade"])
    assert "applying your edit of deploy/deviceplugin/03-daemonset.yaml" in out
    assert f'"{NEW_IMAGE}"' in out
    assert "successfully rolled out" in out
    assert env.images("device-plugin") == [NEW_IMAGE]
    running = pods(env)
    assert len(running) == 2
    assert {p["spec"]["containers"][0]["image"] for p in running} == {NEW_IMAGE}

    # Rollback: the old tag back.
    operator.edit("deploy/deviceplugin/03-daemonset.yaml", NEW_IMAGE, OLD_IMAGE)
    out = operator.play(steps["Rollback"])
    assert "successfully rolled out" in out
    assert env.images("device-plugin") == [OLD_IMAGE]
    assert {p["spec"]["containers"][0]["image"] for p in pods(env)} == {OLD_IMAGE}

    # A configuration change: a setting of the ConfigMap; the pods roll onto it.
    before = {p["metadata"]["name"] for p in pods(env)}
    operator.edit("deploy/deviceplugin/02-configmap.yaml", "log-level: INFO", "log-level: DEBUG")
    out = operator.play(steps["A configuration change"])
    assert "data.log-level" in out
    cm = env.get("configmap", "lj-runtimekit-device-plugin-config")
    assert cm is not None
    assert cm["data"]["log-level"] == "DEBUG"
    daemonset = env.get("daemonset", DAEMONSET)
    assert daemonset is not None
    template = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert template[CHECKSUM_ANNOTATION] == config_checksum(cm["data"])
    after = pods(env)
    assert len(after) == 2
    assert not before & {p["metadata"]["name"] for p in after}
    for pod in after:
        annotations = pod["metadata"]["annotations"]
        assert annotations[CHECKSUM_ANNOTATION] == config_checksum(cm["data"])

    # Deploying the edited checkout again changes nothing (idempotent).
    assert "no change: every object is already as rendered" in operator.play(
        steps["A configuration change"][:1]
    )
