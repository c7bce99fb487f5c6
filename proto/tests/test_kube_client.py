"""The JSON client and the informer against the real API server, the limiter and a server
that does not answer."""

from __future__ import annotations

import base64
import http.server
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.proto.pkg.kube import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    AlreadyExistsError,
    ApiAccess,
    ConflictError,
    GoneError,
    Informer,
    KubeClient,
    KubeError,
    KubeObject,
    NotFoundError,
    RateLimiter,
    WatchCanceller,
    transient,
)
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.waits import wait_for


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[KubeClient]:
    """A client built from the control plane's kubeconfig, as the components build theirs."""
    client = KubeClient.connect(str(control_plane.kubeconfig_path))
    yield client
    client.close()


def _event(name: str, namespace: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": namespace},
        "reason": "Test",
        "message": name,
    }


def _compact(control_plane: ControlPlane, kube: KubeClient, namespace: str) -> None:
    """Compact etcd's history past every write so far: older resourceVersions expire (410)
    for reads that etcd serves (events: the API server keeps no watch cache of them)."""
    marker = {"metadata": {"generateName": "compacted-"}}
    created = kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=marker)
    version = created["metadata"]["resourceVersion"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{control_plane.etcd_port}/v3/kv/compaction",
        data=json.dumps({"revision": int(version), "physical": True}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.mark.controlplane
def test_requests_and_the_errors_the_server_answers(kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    body = {"metadata": {"name": "c", "labels": {"a": "1"}}, "data": {"k": "v"}}
    created = kube.request("POST", path, body=body)
    assert created["data"] == {"k": "v"}
    kube.request("PATCH", f"{path}/c", {"data": {"k": None, "j": "w"}}, content_type=MERGE_PATCH)
    kube.request(
        "PATCH",
        f"{path}/c",
        {"metadata": {"labels": {"b": "2"}}},
        content_type=STRATEGIC_MERGE_PATCH,
    )
    got = kube.request("GET", f"{path}/c")
    assert got["data"] == {"j": "w"}
    assert got["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert json.loads(kube.request_bytes("GET", f"{path}/c"))["data"] == {"j": "w"}

    with pytest.raises(NotFoundError) as missing:
        kube.request("GET", f"{path}/nope")
    assert str(missing.value) == f'GET {path}/nope: HTTP 404: configmaps "nope" not found'
    assert (missing.value.status, missing.value.reason) == (404, "NotFound")
    with pytest.raises(AlreadyExistsError) as exists:
        kube.request("POST", path, body=body)
    assert exists.value.message == 'configmaps "c" already exists'
    stale = {**created, "data": {"k": "stale"}}  # the resourceVersion of the first write
    with pytest.raises(ConflictError) as conflict:
        kube.request("PUT", f"{path}/c", body=stale)
    assert "the object has been modified" in conflict.value.message
    with pytest.raises(KubeError) as invalid:
        kube.request("POST", path, body={"metadata": {"name": "Not_A_Name"}})
    assert invalid.value.status == 422
    assert not any(transient(e.value) for e in (missing, exists, conflict, invalid))


@pytest.mark.controlplane
def test_list_all_pages_through_a_narrowed_list(kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(5):
        kube.request("POST", path, body={"metadata": {"name": f"in-{i}", "labels": {"set": "x"}}})
    kube.request("POST", path, body={"metadata": {"name": "out"}})
    items, version = kube.list_all(path, {"labelSelector": "set=x"}, page=2)
    assert sorted(o["metadata"]["name"] for o in items) == [f"in-{i}" for i in range(5)]
    assert int(version) > 0


@pytest.mark.controlplane
def test_watch_from_a_version_and_from_an_expired_one(
    kube: KubeClient, control_plane: ControlPlane, namespace: str
) -> None:
    path = f"/api/v1/namespaces/{namespace}/events"
    _, version = kube.list_all(path)
    kube.request("POST", path, body=_event("e1", namespace))
    kube.request("PATCH", f"{path}/e1", {"message": "again"}, content_type=MERGE_PATCH)
    kube.request("DELETE", f"{path}/e1")
    seen = [(t, o["metadata"]["name"]) for t, o in kube.watch(path, version, timeout_s=1)]
    assert seen == [("ADDED", "e1"), ("MODIFIED", "e1"), ("DELETED", "e1")]

    _compact(control_plane, kube, namespace)
    with pytest.raises(GoneError) as gone:
        list(kube.watch(path, version, timeout_s=1))
    assert gone.value.status == 410
    assert str(gone.value).startswith(f"WATCH {path}: HTTP 410: ")


class _HeldWatches(KubeClient):
    """The real client with short watches that wait while `hold` is clear, and a count of
    the lists made: the test decides what happens between two watches of an informer."""

    def __init__(self, api: Any) -> None:
        super().__init__(api)
        self.hold = threading.Event()
        self.hold.set()
        self.waiting = threading.Event()
        self.lists = 0

    def list_all(
        self, path: str, params: Mapping[str, str] | None = None, page: int = 500
    ) -> tuple[list[KubeObject], str]:
        self.lists += 1
        return super().list_all(path, params, page)

    def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, str] | None = None,
        timeout_s: int = 300,
        canceller: WatchCanceller | None = None,
    ) -> Iterator[tuple[str, KubeObject]]:
        self.waiting.set()
        self.hold.wait()
        self.waiting.clear()
        yield from super().watch(path, resource_version, params, timeout_s=1, canceller=canceller)


@pytest.mark.controlplane
def test_the_informer_lists_watches_and_lists_again_when_its_version_expired(
    control_plane: ControlPlane, namespace: str
) -> None:
    kube = _HeldWatches(control_plane.api_client())
    path = f"/api/v1/namespaces/{namespace}/events"
    kube.request("POST", path, body=_event("before", namespace))
    kube.request("POST", path, body=_event("gone", namespace))
    seen: list[tuple[str, str]] = []
    informer = Informer(kube, path, lambda t, o: seen.append((t, o["metadata"]["name"])), "events")
    informer.start()
    try:
        assert informer.synced.wait(30)
        assert sorted(seen) == [("ADDED", "before"), ("ADDED", "gone")]
        kube.request("POST", path, body=_event("live", namespace))
        wait_for(lambda: ("ADDED", "live") in seen, 30, "the watch's ADDED", describe=seen.copy)

        # Between two watches: a deletion the informer's version predates, then that
        # version expires. The next watch is refused (410) and a new list finds it out.
        kube.hold.clear()
        assert kube.waiting.wait(30)
        kube.request("DELETE", f"{path}/gone")
        _compact(control_plane, kube, namespace)
        del seen[:]
        assert kube.lists == 1
        kube.hold.set()
        wait_for(lambda: ("DELETED", "gone") in seen, 30, "the list's DELETED", describe=seen.copy)
        # listed again (a list that fails on a loaded API server is retried: one or more)
        assert kube.lists >= 2
        assert sorted(seen) == [("DELETED", "gone"), ("MODIFIED", "before"), ("MODIFIED", "live")]
    finally:
        kube.hold.set()
        informer.stop()
        kube.close()


def test_a_server_that_does_not_answer_is_a_transient_status_0() -> None:
    port = free_port()
    configuration = k8s_client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    kube = KubeClient(k8s_client.ApiClient(configuration))
    try:
        with pytest.raises(KubeError) as caught:
            kube.request("GET", "/api/v1/nodes")
        assert caught.value.status == 0
        assert str(caught.value).startswith("GET /api/v1/nodes: no answer: ")
        assert transient(caught.value)
        with pytest.raises(KubeError) as watch:
            list(kube.watch("/api/v1/nodes", "1"))
        assert watch.value.status == 0
    finally:
        kube.close()


def test_the_limiter_lets_a_burst_through_then_qps() -> None:
    limiter = RateLimiter(qps=20, burst=3)
    start = time.monotonic()
    for _ in range(3):
        limiter.wait()
    assert time.monotonic() - start < 0.05
    for _ in range(4):
        limiter.wait()
    assert time.monotonic() - start >= 4 / 20 - 0.01


@pytest.mark.controlplane
def test_a_metadata_list_comes_in_pages_of_metadata_only(kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(3):
        body = {"metadata": {"name": f"m-{i}", "labels": {"set": "m"}}, "data": {"big": "x"}}
        kube.request("POST", path, body=body)
    pages = list(kube.pages(path, {"labelSelector": "set=m"}, page=2, metadata_only=True))
    assert [len(p["items"]) for p in pages] == [2, 1]
    items = [o for p in pages for o in p["items"]]
    assert sorted(o["metadata"]["name"] for o in items) == ["m-0", "m-1", "m-2"]
    assert all(set(o) == {"apiVersion", "kind", "metadata"} for o in items)
    assert pages[0]["kind"] == "PartialObjectMetadataList"


@pytest.mark.controlplane
def test_a_kubeconfig_with_inline_credentials_reaches_the_server(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """certificate-authority-data, client-certificate-data and client-key-data: the client
    authenticates with PEM data that has no file of its own."""
    config = yaml.safe_load(control_plane.kubeconfig_path.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    for where, key in (
        (cluster, "certificate-authority"),
        (user, "client-certificate"),
        (user, "client-key"),
    ):
        where[key + "-data"] = base64.b64encode(Path(where.pop(key)).read_bytes()).decode()
    inline = tmp_path / "kubeconfig"
    inline.write_text(yaml.safe_dump(config))
    kube = KubeClient.connect(str(inline))
    try:
        assert kube.request("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default"
    finally:
        kube.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kubeconfig"]


@pytest.mark.controlplane
def test_requests_do_not_import_the_official_client(control_plane: ControlPlane) -> None:
    """A process that only makes JSON requests never pays for the official client's import
    (every API and model class: about 75 MB of memory)."""
    code = (
        "import sys\n"
        "from lj_runtimekit.proto.pkg.kube import KubeClient\n"
        f"kube = KubeClient.connect({str(control_plane.kubeconfig_path)!r})\n"
        "kube.request('GET', '/api/v1/namespaces/default')\n"
        "list(kube.pages('/api/v1/nodes', metadata_only=True))\n"
        "kube.close()\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_request_without_an_answer_ends_at_its_timeout() -> None:
    """A server that accepts the connection and never answers: a float timeout holds."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the handshake; nobody ever answers
        kube = KubeClient(ApiAccess(server=f"http://127.0.0.1:{listener.getsockname()[1]}"))
        errors: list[KubeError] = []

        def ask() -> None:
            try:
                kube.request("GET", "/api/v1/nodes", timeout_s=0.5)
            except KubeError as exc:
                errors.append(exc)

        started = time.monotonic()
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(10)
        kube.close()
        assert not asking.is_alive(), "the request ignored its timeout"
    assert time.monotonic() - started < 5
    assert len(errors) == 1
    assert errors[0].status == 0
    assert transient(errors[0])


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    """Answers {} on a kept-alive HTTP/1.1 connection and records each request's target;
    `closed` is set when the client closes it."""

    protocol_version = "HTTP/1.1"
    closed = threading.Event()
    targets: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.targets.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def finish(self) -> None:
        super().finish()
        self.closed.set()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_close_closes_the_pooled_connections() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    kube = KubeClient(ApiAccess(server=f"http://127.0.0.1:{server.server_address[1]}"))
    try:
        assert kube.request("GET", "/api/v1/nodes") == {}
        assert not _KeepAlive.closed.wait(0.2), "the connection was not kept for reuse"
        kube.close()
        wait_for(_KeepAlive.closed.is_set, 5, "the server to see the connection closed")
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_url_with_a_path_prefixes_every_request_also_after_close() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    port = server.server_address[1]
    kube = KubeClient(ApiAccess(server=f"http://127.0.0.1:{port}/k8s/clusters/c1/"))
    _KeepAlive.targets.clear()
    try:
        kube.request("GET", "/api/v1/nodes", query={"limit": 1})
        kube.close()  # the client stays usable: it opens a new connection
        kube.request("GET", "/api/v1/pods")
    finally:
        kube.close()
        server.shutdown()
        server.server_close()
    assert _KeepAlive.targets == [
        "/k8s/clusters/c1/api/v1/nodes?limit=1",
        "/k8s/clusters/c1/api/v1/pods",
    ]
