"""The kubelet `/pods` client over real loopback HTTP: chunked, sized and closing answers;
the API server watch of the node's pods against the real control plane."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.deviceplugin.internal.podlookup.lookup import NodePods, PodLookupError
from lj_runtimekit.deviceplugin.internal.podlookup.watch import PodWatch
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.testkit.podserver import pod_object
from lj_runtimekit.testkit.waits import wait_for

BODY = json.dumps({"kind": "PodList", "items": [pod_object("a", {"c": {"x.io/gpu": 1}})]})


class Server:
    """A loopback server answering every request on a connection with one fixed answer."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.handlers: set[asyncio.Task[None]] = set()
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/pods"
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(self.answer)
                await writer.drain()
                if b"Connection: close" in self.answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
        await writer.wait_closed()

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await asyncio.wait_for(asyncio.gather(*self.handlers), 5)  # clients closed first
        await self._server.wait_closed()


def chunked(body: str) -> bytes:
    data = body.encode()
    parts = [data[:100], data[100:]]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


@pytest.mark.parametrize(
    "answer",
    [
        chunked(BODY),
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY.encode()),
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY.encode(),
    ],
    ids=["chunked", "content-length", "close"],
)
async def test_answers_are_read_whole_and_repeatedly(answer: bytes) -> None:
    async with Server(answer) as server:
        pods = NodePods(server.url, "node-1", None)
        try:
            for _ in range(3):  # kept alive, or reconnected after a closing answer
                (pod,) = await pods.list_pods()
                assert pod.name == "a"
                assert pod.containers[0].limits == {"x.io/gpu": 1}
        finally:
            await pods.aclose()


async def test_http_error_and_closed_port_fail_clearly() -> None:
    async with Server(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n") as server:
        pods = NodePods(server.url, "node-1", None)
        try:
            with pytest.raises(PodLookupError, match="answered HTTP 404"):
                await pods.list_pods()
        finally:
            await pods.aclose()
    closed = NodePods(server.url, "node-1", None)
    try:
        with pytest.raises(PodLookupError, match="no API server access"):
            await closed.list_pods()
    finally:
        await closed.aclose()


@pytest.mark.controlplane
def test_the_watch_remembers_pods_deleted_while_pending(
    control_plane: ControlPlane, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    """The API server watch of the node's pods reports the pods deleted while Pending (the
    kubelet may still admit them), not those deleted once finished, until forgotten."""
    node = f"{namespace}-node"
    kube = KubeClient.connect(str(control_plane.kubeconfig_path))
    watch = PodWatch(kube, node)
    core = k8s_client.CoreV1Api(api_client)
    try:
        watch.start()
        assert watch.wait_synced(30)
        for name in ("pending", "finished"):
            spec = {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
            core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": spec})
        core.patch_namespaced_pod_status("finished", namespace, {"status": {"phase": "Succeeded"}})
        wait_for(
            lambda: {p.name: p.phase for p in watch.pods()}.get("finished") == "Succeeded",
            30,
            "the watch to see the finished pod",
        )
        for name in ("pending", "finished"):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        wait_for(lambda: not watch.pods(), 30, "the watch to see both deletions")
        (gone,) = watch.deleted_pending()
        assert (gone.namespace, gone.name) == (namespace, "pending")
        watch.forget_deleted(gone.uid)
        assert watch.deleted_pending() == []
    finally:
        watch.stop()
        kube.close()
