"""Fixtures of the Scheduler Framework tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.testkit.scheduler.fake import FakeCluster
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster()
    yield c
    c.scheduler.stop()


@pytest.fixture
def make_cluster() -> Iterator[Callable[[Mapping[str, Any] | None], FakeCluster]]:
    made: list[FakeCluster] = []

    def make(config: Mapping[str, Any] | None = None) -> FakeCluster:
        c = FakeCluster(config)
        made.append(c)
        return c

    yield make
    for c in made:
        c.scheduler.stop()


@pytest.fixture
def runtime_class(api_client: k8s_client.ApiClient) -> None:
    """The lj-runtime RuntimeClass workload pods name (the deploy issue installs it)."""
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "lj-runtime"},
        "handler": "lj-runtime",
    }
    try:
        k8s_client.NodeV1Api(api_client).create_runtime_class(body)
    except k8s_client.ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture
def scheduler(control_plane: ControlPlane, namespace: str) -> Iterator[SchedulerProcess]:
    """An `lj-scheduler` subprocess on the real control plane, named after the namespace."""
    s = SchedulerProcess(control_plane.kubeconfig_path, f"lj-{namespace}").start()
    yield s
    s.stop()
