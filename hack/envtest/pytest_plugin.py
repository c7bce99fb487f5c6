"""pytest fixtures for tests against the real control plane.

Enable with `pytest_plugins = ["lj_runtimekit.envtest.pytest_plugin"]` in the
root conftest.py and mark such tests `@pytest.mark.controlplane`.

Fixtures:
    k8s_tools      (session)  {name: Path} of the pinned binaries (kubectl, helm, ...)
    dra_k8s_tools  (session)  the same for the DRA mode's release (DRA_VERSION),
                              lj-hollow-node included
    control_plane  (session)  ControlPlane with etcd, kube-apiserver,
                              kube-controller-manager, kube-scheduler and KWOK;
                              started on first use, stopped at session end
    api_client     (function) kubernetes.client.ApiClient for the admin user
    namespace      (function) name of a fresh namespace (default
                              ServiceAccount present), deleted afterwards
    node_factory   (function) NodeFactory whose nodes carry a group label equal
                              to the test's namespace; deleted afterwards
    kubectl        (function) Kubectl: run kubectl against the control plane

Without the binaries the fixtures fail naming `make k8s-tools` under CI=true
and skip otherwise. LJ_ENVTEST_KEEP=1 keeps the state directory and logs.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.envtest.controlplane import (
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    ControlPlaneError,
)
from lj_runtimekit.envtest.hollownode import BINARY
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.envtest.versions import TOOLS, ToolsMissingError, find_tools
from lj_runtimekit.testkit.waits import wait_for


class Kubectl:
    """Runs kubectl against the control plane, in a namespace by default."""

    def __init__(self, control_plane: ControlPlane, namespace: str | None = None) -> None:
        self.control_plane = control_plane
        self.namespace = namespace

    def __call__(
        self, *args: str, input_text: str | None = None, check: bool = False, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        argv = self.control_plane.kubectl_argv(*args)
        if self.namespace is not None:
            argv.insert(2, f"--namespace={self.namespace}")
        result = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result


def pytest_configure(config: pytest.Config) -> None:
    # kubernetes-client 34 builds every ApiException with urllib3's deprecated
    # HTTPResponse.getheaders(); under filterwarnings=error each 404 would error.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:HTTPResponse.getheaders\\(\\) is deprecated:DeprecationWarning",
    )


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _tools_or_skip(names: tuple[str, ...] = TOOLS, k8s: str | None = None) -> dict[str, Path]:
    try:
        return find_tools(names, k8s)
    except ToolsMissingError as exc:
        if _in_ci():
            pytest.fail(f"{exc} (CI=true: control plane tests never skip)", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def k8s_tools() -> dict[str, Path]:
    """Paths of the pinned binaries by name (etcd, kube-apiserver, ..., kubectl, kwok, helm)."""
    return _tools_or_skip()


@pytest.fixture(scope="session")
def dra_k8s_tools() -> dict[str, Path]:
    """Paths of the DRA mode's release's binaries (DRA_VERSION), lj-hollow-node included:
    ask for it in a test that runs `ControlPlaneConfig(version=DRA_VERSION, ...)`."""
    return _tools_or_skip((*TOOLS, BINARY), DRA_VERSION)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The session's control plane (see the module docstring)."""
    _tools_or_skip()
    keep = os.environ.get("LJ_ENVTEST_KEEP", "") not in {"", "0"}
    cp = ControlPlane(ControlPlaneConfig(keep_state=keep))
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"control plane did not start: {exc}", pytrace=False)
    yield cp
    cp.stop(failed=request.session.testsfailed > 0)


@pytest.fixture
def api_client(control_plane: ControlPlane) -> Iterator[k8s_client.ApiClient]:
    """An admin ApiClient, closed after the test."""
    control_plane.check_alive()
    api = control_plane.api_client()
    try:
        yield api
    finally:
        api.close()


def _namespace_name(nodeid: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", nodeid.rsplit("::", 1)[-1].lower()).strip("-")[:40]
    return f"{base.rstrip('-') or 't'}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(
    control_plane: ControlPlane, api_client: k8s_client.ApiClient, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace for the test, deleted afterwards (not waited for)."""
    core = k8s_client.CoreV1Api(api_client)
    name = _namespace_name(request.node.nodeid)
    core.create_namespace({"metadata": {"name": name}})

    def has_default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    if control_plane.config.controller_manager:
        wait_for(has_default_sa, 30, f"ServiceAccount default in namespace {name}")
    else:
        core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    yield name
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def node_factory(api_client: k8s_client.ApiClient, namespace: str) -> Iterator[NodeFactory]:
    """NodeFactory grouped by the test's namespace; its nodes are deleted afterwards."""
    factory = NodeFactory(api_client, group=namespace)
    yield factory
    factory.cleanup()


@pytest.fixture
def kubectl(control_plane: ControlPlane, namespace: str) -> Kubectl:
    """kubectl against the control plane, in the test's namespace."""
    return Kubectl(control_plane, namespace)


def write_manifest(tmp_path: Path, name: str, documents: Sequence[str]) -> Path:
    """Writes YAML documents to a file under tmp_path (helper for kubectl tests)."""
    path = tmp_path / name
    path.write_text("\n---\n".join(documents))
    return path
