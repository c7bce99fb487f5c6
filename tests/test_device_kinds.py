"""A device kind is one row of the device-kind table: every component follows it.

The test adds a fake kind ("npu", a Runtime enum value the contract does not have yet)
to the table and shows the Device Plugin offering it, labelling and publishing it, the
scheduler placing a pod on it, the Exporter naming it and `verify` checking its
capacity; and that a kind the table does not know is never offered or placed.
"""

from __future__ import annotations

import pytest

from lj_runtimekit.deploy.verify import check_nodes
from lj_runtimekit.deviceplugin.internal.nodelabels.labels import node_inventory, node_labels
from lj_runtimekit.deviceplugin.internal.rm.resources import build_inventory, resource_info
from lj_runtimekit.exporter.internal.metrics.families import whole_resource
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.devicekind import table as kinds_table
from lj_runtimekit.proto.pkg.featuregate import evaluate
from lj_runtimekit.proto.pkg.protocol import decode_assignment, decode_inventory, load_protocol
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import whole_kinds
from lj_runtimekit.testkit.scheduler.fake import FakeCluster

P = load_protocol()
RES = P.resources
NPU_VALUE = 9
UNKNOWN_VALUE = 42

# A real kind also adds its `resources.<key>` default to the protocol; the fake one
# borrows the AMD key, and the table below leaves the AMD row out so no resource is shared.
NPU = devicekind.DeviceKind(NPU_VALUE, "npu", "amd", None, shareable=False)


@pytest.fixture
def npu_table(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu, ppu = devicekind.by_name("gpu"), devicekind.by_name("ppu")
    assert gpu is not None
    assert ppu is not None
    monkeypatch.setattr(kinds_table, "KINDS", (gpu, ppu, NPU))


def device(i: int, kind: int) -> rpb.Device:
    return rpb.Device(
        id=f"DEV-{i}",
        index=i,
        kind=kind,  # type: ignore[arg-type]  # an enum value the contract does not name
        model="X1",
        mode=rpb.DEVICE_MODE_EXCLUSIVE,
        health=rpb.HEALTH_HEALTHY,
    )


@pytest.mark.usefixtures("npu_table")
def test_a_new_kind_is_one_row_of_the_table() -> None:
    npus = [device(0, NPU_VALUE), device(1, NPU_VALUE)]
    # Device Plugin: offered whole under its resource, labelled, published for the scheduler.
    inventory = build_inventory(npus, P, evaluate("v1.15.0"))
    assert [d.id for d in inventory.resources[RES.amd]] == ["DEV-0", "DEV-1"]
    assert inventory.skipped == ()
    info = resource_info(P, RES.amd)
    assert info is not None
    assert info.kind.value == "whole"
    assert node_labels(npus, "v1.15.0", P)[P.labels.device_kind] == "npu"
    published = decode_inventory(node_inventory(npus))
    assert [d.kind for d in published] == ["npu", "npu"]
    # Scheduler: the resource is a whole-device kind, and a pod is placed on a device.
    assert whole_kinds(P)[RES.amd] == "npu"
    cluster = FakeCluster()
    try:
        cluster.add_node("n", gpus=0, inventory=published, extra={RES.amd: "2"})
        pod = cluster.add_pod("p", {RES.amd: "1"})
        cluster.schedule()
        assert cluster.node_of(pod) == "n"
        (share,) = decode_assignment(cluster.assignment(pod))["c0"]
        assert share.whole
        assert share.device_id in ("DEV-0", "DEV-1")
    finally:
        cluster.scheduler.stop()
    # Exporter and verify.
    assert whole_resource(RES, NPU_VALUE) == RES.amd
    node = {
        "metadata": {
            "name": "n",
            "labels": {
                P.labels.enable: "true",
                P.labels.device_kind: "npu",
                P.labels.device_count: "2",
            },
        },
        "status": {"capacity": {RES.amd: "2"}},
    }
    report = check_nodes([node], P)
    assert report.problems == [], report.problems


def test_a_kind_the_table_does_not_know_is_never_offered_or_placed() -> None:
    devices = [device(0, UNKNOWN_VALUE), device(1, rpb.DEVICE_KIND_GPU)]
    inventory = build_inventory(devices, P, evaluate("v1.15.0"))
    offered = {d.id for ds in inventory.resources.values() for d in ds}
    assert offered == {"DEV-1"}
    assert any("DEV-0" in line and "kind" in line for line in inventory.skipped)
    assert [d.id for d in decode_inventory(node_inventory(devices))] == ["DEV-1"]
    assert node_labels(devices[:1], "v1.15.0", P)[P.labels.device_kind] == "unknown"
    assert whole_resource(RES, UNKNOWN_VALUE) == ""
    node = {
        "metadata": {
            "name": "n",
            "labels": {
                P.labels.enable: "true",
                P.labels.device_kind: "unknown",
                P.labels.device_count: "1",
            },
        },
        "status": {"capacity": {}},
    }
    (problem,) = check_nodes([node], P).problems
    assert "not a device kind this Runtime Kit offers (gpu, ppu, amd)" in problem
