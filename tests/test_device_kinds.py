"""A device kind is one row of the device-kind table: every component follows it.

The test adds a fake kind ("npu", a Runtime enum value the contract does not have yet)
as docs/extending.md says: a row in the table and its own protocol key `resources.npu`
(a `Resources` field and a default). It shows the Device Plugin offering it, labelling and
publishing it, the scheduler placing a pod on it, the Exporter naming it, the rendered
DaemonSets tolerating its resource, `verify` checking its capacity and the tolerations,
stale-resource clean-up treating its domain as the protocol's, and the Runtime simulator
reporting it from its feature gate's version; and that a kind the table does not know is
never offered or placed.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from lj_runtimekit.deploy import manifests, verify
from lj_runtimekit.deploy.components import COMPONENTS
from lj_runtimekit.deviceplugin.internal.nodelabels.labels import node_inventory, node_labels
from lj_runtimekit.deviceplugin.internal.rm.resources import build_inventory, resource_info
from lj_runtimekit.exporter.internal.metrics.families import whole_resource
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.devicekind import table as kinds_table
from lj_runtimekit.proto.pkg.featuregate import Feature, evaluate
from lj_runtimekit.proto.pkg.protocol import (
    Protocol,
    decode_assignment,
    decode_inventory,
    load_protocol,
)
from lj_runtimekit.proto.pkg.protocol import constants as protocol_constants
from lj_runtimekit.runtimesim.services import capabilities
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import whole_kinds
from lj_runtimekit.testkit.scheduler import fake
from lj_runtimekit.testkit.scheduler.fake import FakeCluster

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
P = load_protocol()
NPU_VALUE = 9
UNKNOWN_VALUE = 42
NPU_KEY = "resources.npu"
NPU_RESOURCE = "example.com/npu"

# Gated like PPUs and AMD GPUs, so the simulator reports it from that gate's version.
NPU = devicekind.DeviceKind(NPU_VALUE, "npu", "npu", Feature.PPU_AMD_DEVICES, shareable=False)


@dataclasses.dataclass(frozen=True)
class NpuResources(protocol_constants.Resources):
    """The protocol's resources with the new kind's field, as a real kind adds it."""

    npu: str


@pytest.fixture
def npu(monkeypatch: pytest.MonkeyPatch) -> Protocol:
    """The table with the npu row and the protocol with its key: the protocol loaded."""
    monkeypatch.setattr(kinds_table, "KINDS", (*devicekind.KINDS, NPU))
    monkeypatch.setattr(protocol_constants, "Resources", NpuResources)
    defaults = MappingProxyType({**protocol_constants.DEFAULTS, NPU_KEY: NPU_RESOURCE})
    monkeypatch.setattr(protocol_constants, "DEFAULTS", defaults)
    protocol = load_protocol()
    monkeypatch.setattr(fake, "PROTOCOL", protocol)
    return protocol


def device(i: int, kind: int) -> rpb.Device:
    return rpb.Device(
        id=f"DEV-{i}",
        index=i,
        kind=kind,  # type: ignore[arg-type]  # an enum value the contract does not name
        model="X1",
        mode=rpb.DEVICE_MODE_EXCLUSIVE,
        health=rpb.HEALTH_HEALTHY,
    )


def npu_node(capacity: dict[str, str], allocatable: dict[str, str], p: Protocol) -> Any:
    return {
        "metadata": {
            "name": "n",
            "labels": {
                p.labels.enable: "true",
                p.labels.device_kind: "npu",
                p.labels.device_count: "2",
            },
        },
        "status": {"capacity": capacity, "allocatable": allocatable},
    }


def test_a_new_kind_is_one_row_of_the_table(npu: Protocol) -> None:
    assert NPU.resource(npu.resources) == NPU_RESOURCE
    assert npu.as_flat()[NPU_KEY] == NPU_RESOURCE
    npus = [device(0, NPU_VALUE), device(1, NPU_VALUE)]
    # Device Plugin: offered whole under its resource, labelled, published for the scheduler.
    inventory = build_inventory(npus, npu, evaluate("v1.15.0"))
    assert [d.id for d in inventory.resources[NPU_RESOURCE]] == ["DEV-0", "DEV-1"]
    assert inventory.skipped == ()
    info = resource_info(npu, NPU_RESOURCE)
    assert info is not None
    assert info.kind.value == "whole"
    assert node_labels(npus, "v1.15.0", npu)[npu.labels.device_kind] == "npu"
    published = decode_inventory(node_inventory(npus))
    assert [d.kind for d in published] == ["npu", "npu"]
    # Scheduler: the resource is a whole-device kind, and a pod is placed on a device.
    assert whole_kinds(npu)[NPU_RESOURCE] == "npu"
    cluster = FakeCluster()
    try:
        cluster.add_node("n", gpus=0, inventory=published, extra={NPU_RESOURCE: "2"})
        pod = cluster.add_pod("p", {NPU_RESOURCE: "1"})
        cluster.schedule()
        assert cluster.node_of(pod) == "n"
        (share,) = decode_assignment(cluster.assignment(pod))["c0"]
        assert share.whole
        assert share.device_id in ("DEV-0", "DEV-1")
    finally:
        cluster.scheduler.stop()
    # Exporter.
    assert whole_resource(npu.resources, NPU_VALUE) == NPU_RESOURCE
    # The Runtime simulator reports the kind from its feature gate's minimum version on.
    assert "npu" in capabilities("1.14.0")
    assert "npu" not in capabilities("1.13.0")


def test_a_new_kind_goes_through_deploy_and_verify(npu: Protocol) -> None:
    opts = manifests.default_options(DEPLOY)
    # deploy/protocol.yaml spells out every key: the new kind's too.
    opts = dataclasses.replace(
        opts, protocol_text=f"{opts.protocol_text}{NPU_KEY}: {NPU_RESOURCE}\n"
    )
    assert opts.protocol.as_flat() == npu.as_flat()
    daemonsets = [o for o in manifests.render(COMPONENTS, opts) if o["kind"] == "DaemonSet"]
    assert {d["metadata"]["name"] for d in daemonsets} == {
        c.workload for c in COMPONENTS if c.kind == "DaemonSet"
    }
    for ds in daemonsets:
        tolerated = {t["key"] for t in ds["spec"]["template"]["spec"]["tolerations"]}
        assert {NPU_RESOURCE, npu.resources.gpu, npu.resources.ppu} <= tolerated
    assert verify.check_baked(COMPONENTS, daemonsets, npu, "kube-system").problems == []
    # A DaemonSet rendered before the kind was added does not tolerate it: verify says so.
    before = copy.deepcopy(daemonsets)
    for ds in before:
        spec = ds["spec"]["template"]["spec"]
        spec["tolerations"] = [t for t in spec["tolerations"] if t["key"] != NPU_RESOURCE]
    problems = verify.check_baked(COMPONENTS, before, npu, "kube-system").problems
    assert len(problems) == len(before)
    assert all(f"no toleration of {NPU_RESOURCE} ({NPU_KEY})" in p for p in problems)

    # Capacity: the node's npu count is checked against its resource.
    node = npu_node({NPU_RESOURCE: "2"}, {NPU_RESOURCE: "2"}, npu)
    report = verify.check_nodes([node], npu)
    assert report.problems == [], report.problems
    assert report.ok == [f"node n: capacity matches {npu.labels.device_count}=2 ({NPU_RESOURCE}=2)"]
    wrong = verify.check_nodes([npu_node({NPU_RESOURCE: "1"}, {}, npu)], npu).problems
    assert len(wrong) == 1
    assert f"{NPU_RESOURCE}=1 (want 2)" in wrong[0]
    # Clean-up: its domain is the protocol's, so a renamed npu resource's residue is stale;
    # the current one is not, even while the plugin re-registers (allocatable 0).
    old = "example.com/npu-old"
    node = npu_node({NPU_RESOURCE: "2", old: "2"}, {NPU_RESOURCE: "0", old: "0"}, npu)
    assert verify.stale_resources([node], npu) == {"n": [old]}
    assert verify.cleanup_patches([node], npu) == {
        "n": [
            {"op": "remove", "path": "/status/capacity/example.com~1npu-old"},
            {"op": "remove", "path": "/status/allocatable/example.com~1npu-old"},
        ]
    }


def test_a_kind_the_table_does_not_know_is_never_offered_or_placed() -> None:
    res = P.resources
    devices = [device(0, UNKNOWN_VALUE), device(1, rpb.DEVICE_KIND_GPU)]
    inventory = build_inventory(devices, P, evaluate("v1.15.0"))
    offered = {d.id for ds in inventory.resources.values() for d in ds}
    assert offered == {"DEV-1"}
    assert any("DEV-0" in line and "kind" in line for line in inventory.skipped)
    assert [d.id for d in decode_inventory(node_inventory(devices))] == ["DEV-1"]
    assert node_labels(devices[:1], "v1.15.0", P)[P.labels.device_kind] == "unknown"
    assert whole_resource(res, UNKNOWN_VALUE) == ""
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
    (problem,) = verify.check_nodes([node], P).problems
    assert "not a device kind this Runtime Kit offers (gpu, ppu, amd)" in problem
