"""The kubelet `/pods` reader against a real loopback HTTP server (aiohttp.web)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from lj_runtimekit.proto.pkg.kubeletpods import (
    KubeletPodsError,
    KubeletPodsReader,
    check_pods_url,
)

BODY = b'{"kind": "PodList", "items": [' + b", ".join([b'{"metadata": {}}'] * 500) + b"]}"


class Kubelet:
    """A loopback `/pods` endpoint that records the client port of every request."""

    def __init__(self) -> None:
        self.status = 200
        self.peers: list[int] = []
        self.chunked: list[bool] = []
        self.url = ""

    async def pods(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername")[1])
        if self.status != 200:
            return web.Response(status=self.status, text="kubelet says no")
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(BODY), 1000):  # several chunks
            await response.write(BODY[start : start + 1000])
        await response.write_eof()
        self.chunked.append(response.chunked)
        return response


@pytest.fixture
async def kubelet() -> AsyncIterator[Kubelet]:
    server = Kubelet()
    app = web.Application()
    app.router.add_get("/pods", server.pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}/pods"
    yield server
    await runner.cleanup()


async def test_chunked_answers_are_read_whole_over_one_kept_alive_connection(
    kubelet: Kubelet,
) -> None:
    reader = KubeletPodsReader(kubelet.url, timeout_s=5)
    try:
        for _ in range(3):
            assert await reader.get() == BODY
    finally:
        await reader.aclose()
    assert kubelet.chunked == [True, True, True]
    assert len(kubelet.peers) == 3
    assert len(set(kubelet.peers)) == 1, "each read opened a new connection"


async def test_a_url_without_a_path_reads_pods(kubelet: Kubelet) -> None:
    reader = KubeletPodsReader(kubelet.url.removesuffix("/pods"), timeout_s=5)
    try:
        assert await reader.get() == BODY
    finally:
        await reader.aclose()


async def test_an_http_error_names_the_url_and_status(kubelet: Kubelet) -> None:
    kubelet.status = 500
    reader = KubeletPodsReader(kubelet.url, timeout_s=5)
    try:
        with pytest.raises(KubeletPodsError) as err:
            await reader.get()
    finally:
        await reader.aclose()
    assert str(err.value) == f"kubelet {kubelet.url} answered HTTP 500"
    assert (err.value.url, err.value.reason) == (kubelet.url, "answered HTTP 500")


async def test_a_closed_port_is_not_reachable() -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/pods"
        reader = KubeletPodsReader(url, timeout_s=5)
        try:
            with pytest.raises(KubeletPodsError) as err:
                await reader.get()
        finally:
            await reader.aclose()
    assert str(err.value) == f"kubelet {url} not reachable: Connection refused"


async def test_a_kubelet_that_does_not_answer_times_out() -> None:
    gone = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers; returns when the client closes
        writer.close()
        await writer.wait_closed()
        gone.set()

    async with await asyncio.start_server(silent, "127.0.0.1", 0) as server:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/pods"
        reader = KubeletPodsReader(url, timeout_s=0.2)
        try:
            with pytest.raises(KubeletPodsError) as err:
                await reader.get()
        finally:
            await reader.aclose()
        await asyncio.wait_for(gone.wait(), 5)
    assert str(err.value) == f"kubelet {url} did not answer within 0.2 s"


async def test_aclose_without_a_read_and_twice_is_harmless() -> None:
    reader = KubeletPodsReader("http://127.0.0.1:10255/pods", timeout_s=1)
    await reader.aclose()
    await reader.aclose()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:10255/pods", None),
        ("https://node-1:10250/pods", None),
        ("10255/pods", "must be an http:// or https:// URL"),
        ("http:///pods", "has no host"),
        ("http://127.0.0.1:99999/pods", "has an invalid port"),
    ],
)
def test_urls_are_checked(url: str, problem: str | None) -> None:
    found = check_pods_url(url)
    if problem is None:
        assert found is None
        KubeletPodsReader(url, timeout_s=1)
    else:
        assert found is not None
        assert problem in found
        with pytest.raises(ValueError, match=problem):
            KubeletPodsReader(url, timeout_s=1)
