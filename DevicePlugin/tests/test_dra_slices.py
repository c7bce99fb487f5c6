"""The ResourceSlice model: every example node of the Runtime simulator as slices."""

from __future__ import annotations

import re
from typing import Any

import pytest

from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes, profile_selector
from lj_runtimekit.deviceplugin.internal.dra.naming import memory_step, resolve
from lj_runtimekit.deviceplugin.internal.dra.slices import (
    MAX_COUNTER_SETS,
    MAX_DEVICES_APART,
    MAX_SHARED_COUNTERS,
    build_slices,
    counters_apart,
    slice_name,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.proto.pkg.quantity import format_quantity
from lj_runtimekit.testkit.dra import example_devices, synthetic_gpus

PROTOCOL = load_protocol()
DRIVER = PROTOCOL.dra.driver
GIB = 1 << 30


def _build(devices: list[pb.Device], **kw: Any) -> list[dict[str, Any]]:
    return build_slices(devices, node_name="node-1", protocol=PROTOCOL, generation=3, **kw)


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}


def _attr(device: dict[str, Any], name: str) -> object:
    return next(iter(device["attributes"][name].values()))


def test_tdm_node_is_one_pool_of_shareable_gpus() -> None:
    devices = example_devices("tdm-8gpu")
    slices = _build(devices)
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert slices[0]["metadata"]["name"] == f"node-1-{DRIVER}-0"
    assert "ownerReferences" not in slices[0]["metadata"]
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == "node-1"
    assert spec["pool"] == {"name": "node-1", "generation": 3, "resourceSliceCount": 1}
    assert "sharedCounters" not in spec
    published = _devices(slices)
    assert sorted(published) == [f"gpu-{i}" for i in range(8)]
    for device in devices:
        out = published[f"gpu-{device.index}"]
        ref = resolve(devices, out["name"])
        assert ref is not None
        assert ref.runtime_id == device.id
        assert out["allowMultipleAllocations"] is True
        assert "consumesCounters" not in out
        assert "taints" not in out
        assert {k: _attr(out, k) for k in out["attributes"]} == {
            "type": "gpu",
            "model": "A100-SXM4-80GB",
            "uuid": device.id,
            "index": device.index,
            "numaNode": device.index // 4,
            "mode": "tdm",
            "pciBusID": device.pci_bus_id,
            "nvlinkDomain": 0,
        }
        step = memory_step(device)
        assert out["capacity"] == {
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "0", "step": "1"}},
            },
            "memory": {
                "value": format_quantity(100 * step),
                "requestPolicy": {
                    "default": format_quantity(100 * step),
                    "validRange": {"min": "0", "step": format_quantity(step)},
                },
            },
        }
        # 100 steps of 1 %, rounded up: at most 99 bytes above the device's memory, and a
        # quarter of it in bytes is 25 steps.
        assert 0 <= 100 * step - 80 * GIB < 100
        assert -(-(20 * GIB) // step) == 25


def test_mig_node_publishes_instances_with_counters_of_their_gpu() -> None:
    devices = example_devices("mig-8gpu")
    slices = _build(devices)
    # GPUs in one slice, MIG instances with their counter sets in another.
    assert [[d["name"].count("-mig-") for d in s["spec"]["devices"]] for s in slices] == [
        [0] * 6,
        [1] * 9,
    ]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert "sharedCounters" not in slices[0]["spec"]
    published = _devices(slices)
    assert "gpu-6" not in published
    assert "gpu-7" not in published
    counter_sets = {c["name"]: c["counters"] for c in slices[1]["spec"]["sharedCounters"]}
    assert sorted(counter_sets) == ["gpu-6", "gpu-7"]
    for parent in devices[6:]:
        assert counter_sets[f"gpu-{parent.index}"] == {
            "slices": {"value": "7"},
            "memory": {"value": str(80 * GIB)},
        }
        consumed = {"slices": 0, "memory": 0}
        for instance in parent.mig_instances:
            out = published[f"gpu-{parent.index}-mig-{instance.instance_id}"]
            ref = resolve(devices, out["name"])
            assert ref is not None
            assert ref.runtime_id == instance.id
            assert "allowMultipleAllocations" not in out
            assert _attr(out, "type") == "mig"
            assert _attr(out, "mode") == "mig"
            assert _attr(out, "profile") == instance.profile
            assert _attr(out, "uuid") == instance.id
            assert _attr(out, "parentUUID") == parent.id
            assert _attr(out, "parentIndex") == parent.index
            assert _attr(out, "nvlinkDomain") == 0
            assert out["capacity"] == {"memory": {"value": str(instance.memory_bytes)}}
            (use,) = out["consumesCounters"]
            assert use["counterSet"] == f"gpu-{parent.index}"
            for name in consumed:
                consumed[name] += int(use["counters"][name]["value"])
        assert consumed["slices"] <= 7
        assert consumed["memory"] <= 80 * GIB
    assert sorted(
        str(_attr(published[n], "profile")) for n in published if n.startswith("gpu-7-")
    ) == [
        "3g.40gb",
        "4g.40gb",
    ]
    assert sum(n.startswith("gpu-6-mig-") for n in published) == 7


def test_ppu_node_is_whole_devices_with_pairwise_nvlink_domains() -> None:
    devices = example_devices("ppu-16")
    published = _devices(_build(devices))
    assert sorted(published) == sorted(f"ppu-{i}" for i in range(16))
    for device in devices:
        out = published[f"ppu-{device.index}"]
        assert _attr(out, "type") == "ppu"
        assert _attr(out, "nvlinkDomain") == device.index - device.index % 2
        # PPUs are not sliceable: no consumable capacity, one claim at a time.
        assert "allowMultipleAllocations" not in out
        assert out["capacity"] == {"memory": {"value": str(96 * GIB)}}


def test_unhealthy_devices_are_tainted_or_left_out() -> None:
    devices = example_devices("mig-8gpu")
    devices[1].health = pb.HEALTH_UNHEALTHY
    devices[1].health_reason = "XID 79: fallen off the bus"
    devices[6].mig_instances[2].health = pb.HEALTH_UNHEALTHY
    devices[7].health = pb.HEALTH_UNHEALTHY
    devices[7].health_reason = "ECC"
    published = _devices(_build(devices))
    assert published["gpu-1"]["taints"] == [
        {"key": f"{DRIVER}/unhealthy", "value": "XID-79-fallen-off-the-bus", "effect": "NoSchedule"}
    ]
    assert "taints" not in published["gpu-0"]
    tainted = sorted(n for n, d in published.items() if "taints" in d)
    mig7 = [f"gpu-7-mig-{i.instance_id}" for i in devices[7].mig_instances]
    mig6 = f"gpu-6-mig-{devices[6].mig_instances[2].instance_id}"
    assert tainted == sorted(["gpu-1", mig6, *mig7])
    assert {published[n]["taints"][0]["value"] for n in mig7} == {"ECC"}

    without = _devices(_build(devices, taints_supported=False))
    assert sorted(without) == sorted(set(published) - set(tainted))
    assert not any("taints" in d for d in without.values())
    # The counter set of gpu-7 left with its instances.
    _, mig = _build(devices, taints_supported=False)
    assert [c["name"] for c in mig["spec"]["sharedCounters"]] == ["gpu-6"]


def test_unknown_kinds_and_modes_are_never_published() -> None:
    devices = example_devices("tdm-8gpu")
    devices[2].kind = 99  # type: ignore[assignment]
    devices[3].kind = pb.DEVICE_KIND_UNSPECIFIED
    devices[4].mode = pb.DEVICE_MODE_UNSPECIFIED
    published = _devices(_build(devices))
    assert sorted(published) == ["gpu-0", "gpu-1", "gpu-5", "gpu-6", "gpu-7"]


def test_an_empty_node_is_one_empty_slice() -> None:
    (only,) = _build([])
    assert only["spec"]["devices"] == []
    assert only["spec"]["pool"]["resourceSliceCount"] == 1


def test_large_pools_split_at_the_api_limits() -> None:
    slices = _build(synthetic_gpus(300, pb.DEVICE_MODE_TDM))
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert len({s["metadata"]["name"] for s in slices}) == 3
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}

    # Exclusive GPUs consume a counter set each (two counters): 16 per slice.
    slices = _build(synthetic_gpus(40, pb.DEVICE_MODE_EXCLUSIVE))
    assert [len(s["spec"]["devices"]) for s in slices] == [16, 16, 8]
    for s in slices:
        sets = {c["name"] for c in s["spec"]["sharedCounters"]}
        assert sum(len(c["counters"]) for c in s["spec"]["sharedCounters"]) <= MAX_SHARED_COUNTERS
        used = {u["counterSet"] for d in s["spec"]["devices"] for u in d["consumesCounters"]}
        assert used == sets

    # A MIG GPU's instances stay in the slice of its counter set.
    mig = synthetic_gpus(20, pb.DEVICE_MODE_MIG, mig_per_gpu=7)
    slices = _build(mig)
    assert [len(s["spec"]["devices"]) for s in slices] == [16 * 7, 4 * 7]
    for s in slices:
        sets = {c["name"] for c in s["spec"]["sharedCounters"]}
        used = {u["counterSet"] for d in s["spec"]["devices"] for u in d["consumesCounters"]}
        assert used == sets


@pytest.mark.parametrize(("minor", "apart"), [(34, False), (35, True), (37, True)])
def test_counters_apart_from_kubernetes_1_35(minor: int, apart: bool) -> None:
    assert counters_apart(minor) is apart


def test_counters_apart_devices_then_counter_sets() -> None:
    mig = synthetic_gpus(20, pb.DEVICE_MODE_MIG, mig_per_gpu=7)
    together = _devices(_build(mig))
    slices = _build(mig, apart=True)
    devices = [s["spec"] for s in slices if "devices" in s["spec"]]
    counters = [s["spec"] for s in slices if "sharedCounters" in s["spec"]]
    assert len(devices) + len(counters) == len(slices)  # never both in one slice
    # a GPU's seven instances stay together: nine GPUs' (63) fit in MAX_DEVICES_APART
    assert MAX_DEVICES_APART // 7 == 9
    assert [len(d["devices"]) for d in devices] == [63, 63, 14]
    assert [len(c["sharedCounters"]) for c in counters] == [MAX_COUNTER_SETS] * 2 + [4]
    assert _devices(slices) == together  # the same devices, consuming the same counters
    sets = {c["name"] for spec in counters for c in spec["sharedCounters"]}
    assert {u["counterSet"] for d in together.values() for u in d["consumesCounters"]} == sets
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}

    # Nothing to count: devices only; nothing at all: one empty slice.
    assert [
        "sharedCounters" in s["spec"]
        for s in _build(synthetic_gpus(2, pb.DEVICE_MODE_TDM), apart=True)
    ] == [False]
    assert [s["spec"]["devices"] for s in _build([], apart=True)] == [[]]


def test_slices_are_owned_by_the_node_when_its_uid_is_given() -> None:
    (only,) = _build(synthetic_gpus(1, pb.DEVICE_MODE_TDM), node_uid="uid-1")
    assert only["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-1"}
    ]


@pytest.mark.parametrize("node", ["n" * 240, "node-1"])
def test_slice_names_are_valid_object_names(node: str) -> None:
    names = {slice_name(node, DRIVER, n) for n in range(3)}
    assert len(names) == 3
    assert all(len(n) <= 253 for n in names)


_TERM = re.compile(
    r'^device\.attributes\["(?P<domain>[^"]+)"\]\.(?P<name>\w+) == "(?P<value>[^"]*)"$'
)


def _selects(expression: str, device: dict[str, Any]) -> bool:
    """Evaluate one of our class selectors (a conjunction of equalities) on a device."""
    driver_term, *terms = expression.split(" && ")
    assert driver_term == f'device.driver == "{DRIVER}"'
    for term in terms:
        match = _TERM.match(term)
        assert match is not None, term
        assert match["domain"] == DRIVER
        if match["name"] not in device["attributes"]:
            return False
        if str(_attr(device, match["name"])) != match["value"]:
            return False
    return True


MIG_PROFILES = ("1g.10gb", "3g.40gb", "7g.80gb")
"""Two profiles the example `mig-8gpu` has instances of, one it has none of."""


@pytest.mark.parametrize("extended", [True, False])
def test_device_classes_select_what_the_slices_publish(extended: bool) -> None:
    profiles = MIG_PROFILES if extended else ()
    classes = {
        c["metadata"]["name"]: c
        for c in device_classes(PROTOCOL, extended_resources=extended, mig_profiles=profiles)
    }
    per_profile = [f"mig-{p}.{DRIVER}" for p in profiles]
    assert sorted(classes) == sorted(
        [
            f"gpu.{DRIVER}",
            f"ppu.{DRIVER}",
            f"amd.{DRIVER}",
            f"gpu-share.{DRIVER}",
            f"mig.{DRIVER}",
            *per_profile,
        ]
    )
    for obj in classes.values():
        assert obj["apiVersion"] == "resource.k8s.io/v1"
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/part-of": "lj-runtimekit"}
    resources = {n: c["spec"].get("extendedResourceName") for n, c in classes.items()}
    if extended:
        assert resources == {
            f"gpu.{DRIVER}": "alibabacloud.com/gpu",
            f"ppu.{DRIVER}": "alibabacloud.com/ppu",
            f"amd.{DRIVER}": "alibabacloud.com/amd-gpu",
            f"gpu-share.{DRIVER}": None,
            f"mig.{DRIVER}": None,
            f"mig-1g.10gb.{DRIVER}": "alibabacloud.com/mig-1g.10gb",
            f"mig-3g.40gb.{DRIVER}": "alibabacloud.com/mig-3g.40gb",
            f"mig-7g.80gb.{DRIVER}": "alibabacloud.com/mig-7g.80gb",
        }
    else:
        assert set(resources.values()) == {None}
    published = {
        **_devices(_build(example_devices("mig-8gpu"))),
        **_devices(_build(example_devices("ppu-16"))),
    }
    selected = {
        name: sorted(
            d
            for d, device in published.items()
            if _selects(obj["spec"]["selectors"][0]["cel"]["expression"], device)
        )
        for name, obj in classes.items()
    }
    tdm = sorted(f"gpu-{i}" for i in range(6))
    assert selected[f"gpu.{DRIVER}"] == tdm
    assert selected[f"gpu-share.{DRIVER}"] == tdm
    assert selected[f"ppu.{DRIVER}"] == sorted(f"ppu-{i}" for i in range(16))
    assert selected[f"amd.{DRIVER}"] == []
    assert selected[f"mig.{DRIVER}"] == sorted(n for n in published if "-mig-" in n)
    small = profile_selector(PROTOCOL, "1g.10gb")
    assert (
        sum(_selects(f'device.driver == "{DRIVER}" && {small}', published[n]) for n in published)
        == 7
    )
    # A profile's class selects exactly the instances of that profile.
    for profile in profiles:
        name = PROTOCOL.dra.mig_profile_class(profile)
        assert name == f"mig-{profile}.{DRIVER}"
        want = sorted(
            n for n in selected[f"mig.{DRIVER}"] if _attr(published[n], "profile") == profile
        )
        assert selected[name] == want
    if extended:
        assert [len(selected[n]) for n in per_profile] == [7, 1, 0]


@pytest.mark.parametrize(
    ("profiles", "message"),
    [
        (["1g.10gb", "1G.10GB"], "MIG profile '1G.10GB' is not a profile name like 1g.10gb"),
        (["1g.10gb+me"], "MIG profile '1g.10gb+me' is not a profile name like 1g.10gb"),
        (["1g.10gb\n"], "MIG profile '1g.10gb\\n' is not a profile name like 1g.10gb"),
        ([""], "MIG profile '' is not a profile name like 1g.10gb"),
        (["0g.10gb"], "MIG profile '0g.10gb' is not"),
        (["3g.40gb", "3g.40gb"], "MIG profile '3g.40gb' is listed twice"),
    ],
)
def test_device_classes_refuse_a_bad_mig_profile_by_name(profiles: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        device_classes(PROTOCOL, extended_resources=True, mig_profiles=profiles)


def test_mig_profile_classes_need_extended_resources() -> None:
    with pytest.raises(ValueError, match="only with those on"):
        device_classes(PROTOCOL, extended_resources=False, mig_profiles=["1g.10gb"])
