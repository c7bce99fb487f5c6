"""deploy-all.sh delete on a cluster whose Controller cannot disable the nodes: it refuses
and says why, and --keep-node-state uninstalls leaving the nodes as they are."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.testkit.waits import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import ENABLE, STATE, Env

pytestmark = pytest.mark.controlplane


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    api = control_plane.api_client()
    core = k8s_client.CoreV1Api(api)
    namespace = f"lj-uninstall-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": namespace}})
    nodes = NodeFactory(api, group=namespace)
    nodes.create(f"{namespace}-gpu-0", gpus=8)
    env = Env(control_plane, namespace, tmp_path_factory.mktemp("uninstall"))
    yield env
    env.run("delete", "--keep-node-state")
    nodes.cleanup()
    core.delete_namespace(namespace, propagation_policy="Background")
    api.close()


def test_delete_without_a_ready_controller_refuses_then_keep_node_state_uninstalls(
    env: Env,
) -> None:
    node = f"{env.namespace}-gpu-0"
    env.ok("deploy", "--components=controller")
    enabled = {"metadata": {"labels": {STATE: "enabled"}, "annotations": {STATE: "enabled"}}}
    env.k("patch", "node", node, "--type=merge", "-p", json.dumps(enabled))
    env.k("scale", "deployment/lj-runtimekit-controller", "--replicas=0", "-n", env.namespace)

    def none_ready() -> bool:
        live = env.get("deployment", "lj-runtimekit-controller")
        return live is not None and not live.get("status", {}).get("readyReplicas")

    wait_for(none_ready, 60, "the Controller to have no ready replica")
    result = env.run("delete")
    assert result.returncode == 1
    assert (
        f"{env.namespace}/lj-runtimekit-controller) has no ready replica, so nothing can"
        f" disable the Runtime features of {node}; fix: bring the Controller back, or"
        " delete with --keep-node-state"
    ) in result.stderr
    assert env.get("deployment", "lj-runtimekit-controller") is not None
    out = env.ok("delete", "--keep-node-state")
    assert "--keep-node-state: the nodes keep their Runtime features" in out
    assert env.get("deployment", "lj-runtimekit-controller") is None
    live = env.get("node", node, namespaced=False)
    assert live is not None
    assert live["metadata"]["labels"][ENABLE] == "true"
    assert live["metadata"]["annotations"][STATE] == "enabled"
