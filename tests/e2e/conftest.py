"""The sandbox bed for end-to-end tests: one bed per module (`bed` fixture)."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest import ToolsMissingError, find_tools
from lj_runtimekit.sandbox import Sandbox, SandboxConfig, workload
from lj_runtimekit.testkit.waits import wait_for

_NAMESPACES = itertools.count(1)


def make_bed(
    kinds: tuple[str, ...], session: pytest.Session, *, read_only_port: bool = True
) -> Iterator[Sandbox]:
    """A started sandbox with its nodes enabled (logs kept when a test of it failed);
    `read_only_port=False`: the kubelets keep /pods closed (the API server serves)."""
    try:
        find_tools()
    except ToolsMissingError as exc:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"{exc} (run `make k8s-tools`)")
        pytest.skip(str(exc))
    state = Path(tempfile.mkdtemp(prefix="lje2e", dir="/tmp"))
    config = SandboxConfig(
        nodes=len(kinds), kinds=kinds, state_dir=state, kubelet_read_only_port=read_only_port
    )
    bed = Sandbox(config, progress=lambda m: print(f"[bed] {m}", flush=True))
    with bed:
        with bed.api_client() as api:
            names = [n.name for n in bed.nodes]
            workload.label_nodes(api, names, bed.protocol.labels.enable, "true")
            workload.wait_feature_state(api, names, "enabled")
        failed_before = session.testsfailed
        yield bed
        if session.testsfailed > failed_before:
            bed.config.keep_state = True
            print(f"[bed] a test failed: logs kept in {bed.log_dir}", flush=True)


@pytest.fixture(scope="module")
def bed(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A started sandbox with its nodes enabled; kinds from the module's BED_KINDS."""
    kinds = getattr(request.module, "BED_KINDS", ("tdm-8gpu", "mig-8gpu"))
    yield from make_bed(tuple(kinds), request.session)


@pytest.fixture
def api(bed: Sandbox) -> Iterator[k8s_client.ApiClient]:
    with bed.api_client() as client:
        yield client


@pytest.fixture
def ns(bed: Sandbox, api: k8s_client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; its pods are deleted afterwards (devices freed)."""
    short = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())
    name = f"e2e{next(_NAMESPACES)}-{short.replace('test-', '', 1)[:40].strip('-')}"
    workload.ensure_namespace(api, name)
    yield name
    k8s_client.CoreV1Api(api).delete_namespace(name)
    # The Device Plugin releases a gone pod's Runtime allocation after its grace period;
    # wait for it so that the next test starts from free devices.
    wait_for(
        lambda: name not in workload.runtime_namespaces(bed.nodes),
        60,
        f"Runtime allocations of namespace {name} released",
    )
