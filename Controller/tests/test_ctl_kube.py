"""The Controller's API calls on the shared API layer: the errors the real API server
answers (404 gone, 409 by its reason), and transient failures retried within the bounds
(the official client's calls stubbed)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pytest_mock import MockerFixture

from lj_runtimekit.controller.internal.kube.client import Kube
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.proto.pkg.kube import (
    AlreadyExistsError,
    ConflictError,
    KubeError,
    RetryPolicy,
)


@pytest.fixture
def stubbed(mocker: MockerFixture) -> Iterator[Kube]:
    """A Kube whose typed API calls are mocks (no server)."""
    kube = Kube(k8s.ApiClient(), threads=2)
    kube.core = mocker.Mock()
    kube.batch = mocker.Mock()
    yield kube
    kube.close()


def _answer(obj: object) -> SimpleNamespace:
    return SimpleNamespace(data=json.dumps(obj).encode())


def _refused(status: int, reason: str, message: str) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "reason": reason, "message": message})
    return exc


async def test_a_transient_failure_is_retried_and_logged(
    stubbed: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """Also under warnings-as-errors: the backoff raises no deprecation warning."""
    stubbed.core.read_node.side_effect = [
        _refused(503, "ServiceUnavailable", "busy"),
        _answer({"metadata": {"name": "n"}}),
    ]
    with caplog.at_level(logging.WARNING):
        assert await stubbed.read_node("n") == {"metadata": {"name": "n"}}
    assert stubbed.core.read_node.call_count == 2
    retries = [r for r in caplog.records if r.getMessage() == "API call failed, retrying"]
    assert [r.call for r in retries] == ["read node n"]  # type: ignore[attr-defined]


async def test_a_refusal_is_not_retried_and_names_the_call(stubbed: Kube) -> None:
    stubbed.batch.list_namespaced_job.side_effect = _refused(403, "Forbidden", "jobs is forbidden")
    with pytest.raises(KubeError) as refused:
        await stubbed.list_jobs("ns", "a=b")
    assert str(refused.value) == "list jobs ns a=b: HTTP 403: jobs is forbidden"
    assert stubbed.batch.list_namespaced_job.call_count == 1


async def test_no_answer_is_retried_within_the_attempts(stubbed: Kube) -> None:
    stubbed.retry = RetryPolicy(attempts=3, timeout_s=None, initial_s=0.0, jitter_s=0.0)
    stubbed.core.list_namespaced_pod.side_effect = ConnectionRefusedError("refused")
    with pytest.raises(KubeError) as failed:
        await stubbed.list_pods("ns", "a=b")
    assert failed.value.status == 0
    assert str(failed.value) == "list pods ns a=b: no answer: refused"
    assert stubbed.core.list_namespaced_pod.call_count == 3


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    """A Kube against the control plane, as the Controller builds it."""
    kube = Kube(control_plane.api_client(), threads=2)
    yield kube
    kube.close()


@pytest.mark.controlplane
async def test_the_errors_the_server_answers(
    kube: Kube, namespace: str, node_factory: NodeFactory
) -> None:
    assert await kube.read_node("absent-node") is None
    assert await kube.patch_node("absent-node", {"metadata": {"labels": {"a": "b"}}}, None) is None

    name = node_factory.create("kube-calls")
    node = await kube.read_node(name)
    assert node is not None
    stale = node["metadata"]["resourceVersion"]
    await kube.patch_node(name, {"metadata": {"labels": {"a": "1"}}}, None)
    with pytest.raises(ConflictError):
        await kube.patch_node(name, {"metadata": {"labels": {"a": "2"}}}, stale)

    job = {
        "metadata": {"name": "j", "namespace": namespace},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}
            },
        },
    }
    uid = (await kube.create_job(job))["metadata"]["uid"]
    with pytest.raises(AlreadyExistsError) as exists:
        await kube.create_job(job)
    assert str(exists.value) == (
        f'create job {namespace}/j: HTTP 409: jobs.batch "j" already exists'
    )
    assert not await kube.delete_job(namespace, "j", "another-uid", "Background")  # Conflict
    assert await kube.delete_job(namespace, "j", uid, "Background")
    assert not await kube.delete_job(namespace, "j", uid, "Background")  # NotFound
