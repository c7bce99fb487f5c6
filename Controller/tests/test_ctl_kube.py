"""The Controller's API calls on the shared API layer: the errors the real API server
answers (404 gone, 409 by its reason), transient failures retried within the bounds (the
shared client's requests stubbed), and no import of the official client."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_mock import MockerFixture

from lj_runtimekit.controller.internal.kube.client import Kube
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import GROUP_LABEL, NodeFactory
from lj_runtimekit.proto.pkg.kube import (
    AlreadyExistsError,
    ApiAccess,
    ConflictError,
    KubeClient,
    KubeError,
    RetryPolicy,
    kube_error,
)


@pytest.fixture
def stubbed(mocker: MockerFixture) -> Iterator[Kube]:
    """A Kube whose requests are mocks (no server)."""
    kube = Kube(KubeClient(ApiAccess(server="http://127.0.0.1:1")), threads=2)
    mocker.patch.object(kube.client, "request")
    yield kube
    kube.close()


def _refused(status: int, reason: str, message: str) -> KubeError:
    return kube_error("", status, message, reason)


async def test_a_transient_failure_is_retried_and_logged(
    stubbed: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """Also under warnings-as-errors: the backoff raises no deprecation warning."""
    request = stubbed.client.request
    request.side_effect = [  # type: ignore[attr-defined]
        _refused(503, "ServiceUnavailable", "busy"),
        {"metadata": {"name": "n"}},
    ]
    with caplog.at_level(logging.WARNING):
        assert await stubbed.read_node("n") == {"metadata": {"name": "n"}}
    assert request.call_count == 2  # type: ignore[attr-defined]
    retries = [r for r in caplog.records if r.getMessage() == "API call failed, retrying"]
    assert [r.call for r in retries] == ["read node n"]  # type: ignore[attr-defined]


async def test_a_refusal_is_not_retried_and_names_the_call(stubbed: Kube) -> None:
    request = stubbed.client.request
    request.side_effect = _refused(403, "Forbidden", "jobs is forbidden")  # type: ignore[attr-defined]
    with pytest.raises(KubeError) as refused:
        await stubbed.list_jobs("ns", "a=b")
    assert str(refused.value) == "list jobs ns a=b: HTTP 403: jobs is forbidden"
    assert request.call_count == 1  # type: ignore[attr-defined]


async def test_no_answer_is_retried_within_the_attempts(stubbed: Kube) -> None:
    stubbed.retry = RetryPolicy(attempts=3, timeout_s=None, initial_s=0.0, jitter_s=0.0)
    request = stubbed.client.request
    request.side_effect = ConnectionRefusedError("refused")  # type: ignore[attr-defined]
    with pytest.raises(KubeError) as failed:
        await stubbed.list_pods("ns", "a=b")
    assert failed.value.status == 0
    assert str(failed.value) == "list pods ns a=b: no answer: refused"
    assert request.call_count == 3  # type: ignore[attr-defined]


def test_the_controller_does_not_import_the_official_client() -> None:
    """kopf would import it when installed; its API and model classes were most of the
    Controller's memory."""
    code = (
        "import sys\n"
        "import lj_runtimekit.controller.cmd.controller.main\n"
        "import kopf\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    """A Kube against the control plane, as the Controller builds it."""
    kube = Kube(KubeClient.connect(str(control_plane.kubeconfig_path), pool_size=2), threads=2)
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


@pytest.mark.controlplane
async def test_node_metadata_keeps_labels_and_annotations_of_every_page(
    kube: Kube, node_factory: NodeFactory
) -> None:
    names = [node_factory.create(f"meta-{i}", wait=False) for i in range(3)]
    await kube.patch_node(names[0], {"metadata": {"annotations": {"x": "1"}}}, None)
    selector = f"{GROUP_LABEL}={node_factory.group}"
    listed = await kube.node_metadata(selector, page=2)
    assert sorted(listed) == sorted(names)
    for name, meta in listed.items():
        # managedFields, uid, versions and the rest are dropped as each page comes in.
        assert set(meta) <= {"labels", "annotations"}, (name, sorted(meta))
        assert meta["labels"][GROUP_LABEL] == node_factory.group
    assert listed[names[0]]["annotations"]["x"] == "1"


async def test_a_queued_event_keeps_the_nodes_name_and_uid_not_the_node(stubbed: Kube) -> None:
    class Node(dict[str, Any]):  # a dict that can be weakly referenced
        pass

    node = Node(metadata={"name": "n1", "uid": "u1", "managedFields": [{"big": "x" * 1000}]})
    gone = weakref.ref(node)
    sent = threading.Event()
    stubbed.client.request.side_effect = lambda *a, **k: sent.wait(10) and {}  # type: ignore[attr-defined]
    stubbed.node_event("default", node, "Normal", "FeaturesEnabled", "done")
    del node
    gc.collect()
    assert gone() is None  # while the post waits for its thread
    sent.set()
    await stubbed.drain_events()
    method, path, body = stubbed.client.request.call_args.args[:3]  # type: ignore[attr-defined]
    assert (method, path) == ("POST", "/api/v1/namespaces/default/events")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
    assert (body["reason"], body["message"], body["type"]) == ("FeaturesEnabled", "done", "Normal")
