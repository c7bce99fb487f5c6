"""The pods view: PodList parsing, assignment annotations, kubelet errors, API server fallback."""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from lj_runtimekit.exporter.internal.allocation.assignments import pod_allocations
from lj_runtimekit.exporter.internal.pods.kubelet import KubeletPods, PodSourceError
from lj_runtimekit.exporter.internal.pods.model import Pod, PodListError, parse_pod_list
from lj_runtimekit.exporter.internal.pods.source import NodePods
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol

ANNOTATIONS = load_protocol().annotations


def _pod(uid: str, annotations: dict[str, str], phase: str = "Running") -> Pod:
    return Pod(uid, "ns", f"pod-{uid}", phase, "node-a", ("c",), annotations)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([], "expected a JSON object"),
        ({"items": {}}, "'items' must be a list"),
        ({"items": [1]}, "items[0] must be an object"),
        ({"items": [{"metadata": {"name": "x"}}]}, "items[0].metadata.uid is missing"),
    ],
)
def test_pod_list_errors_say_what_is_wrong(data: object, problem: str) -> None:
    with pytest.raises(PodListError, match=r"^kubelet x: .*" + re.escape(problem)):
        parse_pod_list(data, "kubelet x")


def test_pod_list_parsing_keeps_what_the_exporter_needs() -> None:
    pods = parse_pod_list(
        {
            "items": [
                {
                    "metadata": {
                        "uid": "u1",
                        "namespace": "ns",
                        "name": "p",
                        "annotations": {"a": "b", "n": 1},
                    },
                    "spec": {"nodeName": "n1", "containers": [{"name": "c1"}, {"name": "c2"}]},
                    "status": {"phase": "Pending"},
                }
            ]
        },
        "here",
    )
    assert pods == (Pod("u1", "ns", "p", "Pending", "n1", ("c1", "c2"), {"a": "b"}),)
    assert parse_pod_list({"kind": "PodList", "items": None}, "here") == ()


def test_allocations_prefer_what_was_allocated_over_what_was_assigned() -> None:
    whole = encode_assignment({"c": (DeviceShare("gpu-0"),)})
    slice_ = encode_assignment({"c": (DeviceShare("gpu-1", 30, 40),)})
    pods = [
        _pod("a", {ANNOTATIONS.allocated_devices: whole, ANNOTATIONS.assigned_devices: slice_}),
        _pod("b", {ANNOTATIONS.assigned_devices: slice_}),
        _pod("c", {ANNOTATIONS.allocated_devices: whole}, phase="Succeeded"),
        _pod("d", {}),
        _pod("e", {ANNOTATIONS.allocated_devices: '{"c": [{"id": "gpu-2", "core": 150}]}'}),
    ]
    result = pod_allocations(pods, ANNOTATIONS)
    assert result.by_device["gpu-0"].core_percent == 100
    assert result.by_device["gpu-0"].containers == 1
    assert (result.by_device["gpu-1"].core_percent, result.by_device["gpu-1"].memory_percent) == (
        30,
        40,
    )
    assert "gpu-2" not in result.by_device
    assert set(result.by_container) == {("a", "c"), ("b", "c")}
    (problem,) = result.problems
    assert problem.startswith(f"pod=ns/pod-e annotation {ANNOTATIONS.allocated_devices}: ")
    assert "c[0].core" in problem


async def test_kubelet_errors_name_the_url(lj: Any) -> None:
    server = lj.kubelet_pods()
    url = server.url
    wrong = url.replace("/pods", "/wrong")
    with pytest.raises(
        PodSourceError, match=r"kubelet http://127\.0\.0\.1:\d+/wrong answered HTTP 404"
    ):
        async with contextlib.aclosing(KubeletPods(wrong, timeout_s=2)) as pods:
            await pods.list_pods()
    server.stop()
    with pytest.raises(PodSourceError, match=r"not reachable: .*[Cc]onnection refused"):
        async with contextlib.aclosing(KubeletPods(url, timeout_s=2)) as pods:
            await pods.list_pods()


class _Lister:
    def __init__(self, pods: tuple[Pod, ...] | None) -> None:
        self.pods = pods
        self.calls = 0
        self.problem: str | None = None
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1

    async def list_pods(self) -> tuple[Pod, ...]:
        self.calls += 1
        if self.pods is None:
            raise PodSourceError("API server down")
        return self.pods


async def test_fallback_to_the_api_server_is_logged_once(
    lj: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = lj.kubelet_pods([lj.PodSpec("k1", "ns", "from-kubelet", ("c",), {})])
    fallback = _Lister((_pod("f1", {}),))
    async with contextlib.aclosing(KubeletPods(kubelet.url, timeout_s=2)) as pods:
        source = NodePods(pods, fallback)
        read = await source.read()
        assert read.view is not None
        assert (read.view.source, read.kubelet_up, fallback.calls) == ("kubelet", True, 0)
        kubelet.stop()
        with caplog.at_level(logging.WARNING):
            first = await source.read()
            second = await source.read()
        for read in (first, second):
            assert read.view is not None
            assert (read.view.source, read.kubelet_up) == ("apiserver", False)
            assert [s for s, _ in read.errors] == ["kubelet"]
        assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
        assert "API server" in caplog.records[0].getMessage()
        fallback.pods = None
        read = await source.read()
        assert read.view is None
        assert [s for s, _ in read.errors] == ["kubelet", "apiserver"]


async def test_without_the_kubelet_the_watch_is_the_only_source() -> None:
    watch = _Lister((_pod("w1", {}),))
    source = NodePods(None, watch)
    read = await source.read()
    assert read.view is not None
    assert (read.view.source, read.kubelet_up, read.errors) == ("apiserver", None, ())
    # A broken watch: its last copy is still served, and the failure is counted.
    watch.problem = "watch broken, serving its last copy: no answer"
    read = await source.read()
    assert read.view is not None
    assert read.view.pods == watch.pods
    assert read.errors == (("apiserver", watch.problem),)
    watch.pods = None
    read = await source.read()
    assert (read.view, read.kubelet_up) == (None, None)
    assert [s for s, _ in read.errors] == ["apiserver"]


async def test_the_fallback_watch_runs_only_while_the_kubelet_is_down(
    lj: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = lj.kubelet_pods([lj.PodSpec("k1", "ns", "from-kubelet", ("c",), {})])
    kubelet.port = urlsplit(kubelet.url).port  # started again on the same port
    fallback = _Lister((_pod("f1", {}),))
    async with contextlib.aclosing(KubeletPods(kubelet.url, timeout_s=2)) as pods:
        source = NodePods(pods, fallback)
        with caplog.at_level(logging.INFO):
            for down in (True, False, True, False):
                if down:
                    kubelet.stop()
                else:
                    kubelet.start()
                read = await source.read()
                read_again = await source.read()
                for r in (read, read_again):
                    assert r.view is not None
                    assert r.view.source == ("apiserver" if down else "kubelet")
            kubelet.stop()
        # Stopped each time the kubelet answered again, restarted by the next read after.
        assert fallback.stops == 2
        assert fallback.calls == 4
        messages = [r.getMessage() for r in caplog.records]
        assert sum("reading pods from the API server" in m for m in messages) == 2
        assert sum("API server watch is stopped" in m for m in messages) == 2
