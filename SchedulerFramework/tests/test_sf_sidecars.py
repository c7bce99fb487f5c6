"""Sidecars (restartable init containers) on the in-memory framework: a sidecar runs beside
every init container declared after it, so the pod holds both at once (the kubelet's device
manager counts them so; Kubernetes' resource rule too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lj_runtimekit.proto.pkg.protocol import decode_assignment
from lj_runtimekit.schedulerframework.internal.cache.podinfo import parse_pod
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.assign import copies_that_fit
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import (
    DeviceRequest,
    parse_device_request,
)
from lj_runtimekit.testkit.scheduler.fake import (
    CORE,
    GPU,
    MEM,
    PROTOCOL,
    FakeCluster,
    nvlink_inventory,
)

MIG_1G = PROTOCOL.resources.mig("1g.10gb")


def _init(name: str, limits: Mapping[str, str], sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "resources": {"limits": dict(limits)}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def _pod(init: list[dict[str, Any]], apps: list[Mapping[str, str]]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {
            "containers": [
                {"name": f"c{i}", "resources": {"limits": dict(c)}} for i, c in enumerate(apps)
            ],
            "initContainers": init,
        },
    }


def test_cpu_and_whole_devices_follow_one_rule() -> None:
    """Per init container, its ask plus the sidecars declared before it; all sidecars plus
    all app containers; the pod asks for the largest of those (cpu and devices alike)."""
    init = [
        _init("side", {GPU: "2", "cpu": "2"}, sidecar=True),
        _init("prep", {GPU: "3", "cpu": "3"}),
        _init("late", {GPU: "1", "cpu": "1"}, sidecar=True),
    ]
    pod = parse_pod(_pod(init, [{GPU: "1", "cpu": "1"}]))
    req = parse_device_request(pod, PROTOCOL)
    assert req is not None
    assert dict(req.whole_total) == {"gpu": 5}  # side + prep
    assert pod.requests["cpu"] == 5000


def test_an_init_container_beside_a_sidecar_gets_devices_of_its_own(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    uid = cluster.add_pod(
        "p",
        {GPU: "1"},
        initContainers=[_init("side", {GPU: "4"}, sidecar=True), _init("prep", {GPU: "4"})],
    )
    cluster.schedule()
    assert cluster.node_of(uid) == "a"
    got = decode_assignment(cluster.assignment(uid))
    side = {s.device_id for s in got["side"]}
    prep = {s.device_id for s in got["prep"]}
    main = {s.device_id for s in got["c0"]}
    assert len(side) == len(prep) == 4
    assert not side & prep  # they run at the same time
    assert not side & main
    assert main <= prep  # the app container reuses the finished init container's device
    node = cluster.scheduler.cache.nodes["a"]
    assert node.devices.free_whole_count("gpu") == 0  # the pod holds 8
    other = cluster.add_pod("other", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(other) == ""
    assert cluster.scheduler.cache.violations() == []


def test_a_sidecar_and_init_container_too_large_together_are_refused(
    cluster: FakeCluster,
) -> None:
    cluster.add_node("a")
    uid = cluster.add_pod(
        "p",
        {GPU: "1"},
        initContainers=[_init("side", {GPU: "4"}, sidecar=True), _init("prep", {GPU: "6"})],
    )
    cluster.schedule()
    assert cluster.node_of(uid) == ""
    (msg,) = cluster.events(uid, "FailedScheduling")
    assert f"pod asks for 10 {GPU} in all but the largest node has 8" in msg


def test_a_sidecar_slice_before_an_init_slice_adds_to_the_device(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    uid = cluster.add_pod(
        "p",
        {CORE: "20", MEM: "20"},
        initContainers=[
            _init("side", {CORE: "30", MEM: "10"}, sidecar=True),
            _init("prep", {CORE: "50", MEM: "50"}),
            _init("late", {CORE: "10", MEM: "10"}, sidecar=True),
        ],
    )
    cluster.schedule()
    got = decode_assignment(cluster.assignment(uid))
    assert len({s.device_id for shares in got.values() for s in shares}) == 1
    (share,) = got["c0"]
    dev = cluster.scheduler.cache.nodes["a"].devices.by_id[share.device_id]
    # core: max(30 + 50, 30 + 10 + 20); memory: max(10 + 50, 10 + 10 + 20)
    assert (dev.core_used, dev.memory_used) == (80, 60)
    assert cluster.scheduler.cache.violations() == []


def test_an_init_container_beside_a_sidecar_gets_mig_instances_of_its_own(
    cluster: FakeCluster,
) -> None:
    inv = nvlink_inventory("a", mig={7: ["1g.10gb"] * 3})
    cluster.add_node("a", inventory=inv, extra={MIG_1G: "3"})
    uid = cluster.add_pod(
        "p",
        {"cpu": "1"},
        initContainers=[_init("side", {MIG_1G: "1"}, sidecar=True), _init("prep", {MIG_1G: "1"})],
    )
    cluster.schedule()
    got = decode_assignment(cluster.assignment(uid))
    assert got["prep"] != got["side"]  # they run at the same time
    # the pod holds 2 instances (side + prep): one of the 3 is left
    assert (
        copies_that_fit(cluster.scheduler.cache.nodes["a"].devices, _mig_request(), "binpack", 10)
        == 1
    )
    assert cluster.scheduler.cache.violations() == []


def _mig_request() -> DeviceRequest:
    req = parse_device_request(parse_pod(_pod([], [{MIG_1G: "1"}])), PROTOCOL)
    assert req is not None
    return req
