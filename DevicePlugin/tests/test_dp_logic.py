"""Pure logic: resources, candidate resolution, topology, labels, pod parsing."""

from __future__ import annotations

from lj_runtimekit.deviceplugin.internal.allocate.allocator import normalize
from lj_runtimekit.deviceplugin.internal.allocate.resolve import (
    _time_key,
    candidates,
    choose,
    same_devices,
)
from lj_runtimekit.deviceplugin.internal.allocate.topology import best_set
from lj_runtimekit.deviceplugin.internal.kubeletshim.pods import pod_object
from lj_runtimekit.deviceplugin.internal.nodelabels.labels import label_value, node_labels
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import PodInfo, parse_pod
from lj_runtimekit.deviceplugin.internal.rm.resources import (
    build_inventory,
    resource_info,
    slice_unit_device,
)
from lj_runtimekit.deviceplugin.pkg.configpb import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg.featuregate import evaluate
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.proto.pkg.version import Version

P = load_protocol()
RES, ANN = P.resources, P.annotations
V1 = Version(1, 15, 0)


def gpu(i: int, mode: rpb.DeviceMode.ValueType = rpb.DEVICE_MODE_TDM, **kw: object) -> rpb.Device:
    return rpb.Device(
        id=f"GPU-{i}",
        index=i,
        kind=rpb.DEVICE_KIND_GPU,
        model="A100 SXM4/80GB",
        numa_node=i // 4,
        mode=mode,
        health=rpb.HEALTH_HEALTHY,
        **kw,  # type: ignore[arg-type]
    )


def test_inventory_modes_gates_and_runtime_loss() -> None:
    mig = gpu(
        2,
        rpb.DEVICE_MODE_MIG,
        mig_instances=[
            rpb.MigInstance(id="MIG-a", profile="1g.10gb", health=rpb.HEALTH_HEALTHY),
            rpb.MigInstance(id="MIG-b", profile="1g.10gb", health=rpb.HEALTH_UNHEALTHY),
        ],
    )
    ppu = rpb.Device(id="PPU-0", index=3, kind=rpb.DEVICE_KIND_PPU, mode=rpb.DEVICE_MODE_TDM)
    devices = [gpu(0), gpu(1, rpb.DEVICE_MODE_EXCLUSIVE), mig, ppu]
    on = build_inventory(devices, P, evaluate("v1.14.0", V1))
    assert len(on.resources[RES.gpu]) == 2
    assert len(on.resources[RES.core]) == 100  # only the TDM device is sliced
    assert [d.healthy for d in on.resources[RES.mig("1g.10gb")]] == [True, False]
    assert [d.id for d in on.resources[RES.ppu]] == ["PPU-0"]
    off = build_inventory(devices, P, evaluate("v1.13.0", V1))
    assert RES.mig("1g.10gb") not in off.resources
    assert RES.ppu not in off.resources
    assert any("MIG feature gate is off" in s for s in off.skipped)
    down = build_inventory(devices, P, evaluate("v1.14.0", V1), runtime_up=False)
    assert all(not d.healthy for ds in down.resources.values() for d in ds)
    assert len(down.resources[RES.core]) == 100  # listed, not missing


def test_slice_unit_ids_and_resource_kinds() -> None:
    assert slice_unit_device("GPU-1::99") == "GPU-1"
    assert slice_unit_device("GPU-1::100") is None
    assert slice_unit_device("GPU-1") is None
    info = resource_info(P, RES.mig("3g.40gb"))
    assert info is not None
    assert info.mig_profile == "3g.40gb"
    assert resource_info(P, "example.com/other") is None


def _pods(*specs: tuple[str, int, str | None, str]) -> list[PodInfo]:
    out = []
    for name, count, device, assume in specs:
        ann = {ANN.assume_time: assume}
        if device:
            ann[ANN.assigned_devices] = encode_assignment({"c": (DeviceShare(device),)})
        out.append(parse_pod(pod_object(name, {"c": {RES.gpu: count}}, annotations=ann)))
    return out


def test_candidates_order_identity_and_progress() -> None:
    pods = _pods(("late", 1, "GPU-1", "30"), ("early", 1, "GPU-2", "10"), ("two", 2, None, "5"))
    ordered = candidates(pods, RES.gpu, 1, set(), set(), ANN.assigned_devices, ANN.assume_time)
    assert [c.pod.name for c in ordered] == ["early", "late"]  # by assume time; count filters
    info = resource_info(P, RES.gpu)
    assert info is not None
    chosen, by_devices = choose(ordered, lambda c: same_devices(c, info, ["GPU-1"]))
    assert chosen is not None
    assert (chosen.pod.name, by_devices) == ("late", True)
    chosen, by_devices = choose(ordered, lambda c: same_devices(c, info, ["GPU-9"]))
    assert chosen is not None
    assert (chosen.pod.name, by_devices) == ("early", False)
    # A pod in progress is the only group considered, whatever the devices say.
    late_uid = next(p.uid for p in pods if p.name == "late")
    ordered = candidates(pods, RES.gpu, 1, set(), {late_uid}, ANN.assigned_devices, ANN.assume_time)
    chosen, _ = choose(ordered, lambda c: same_devices(c, info, ["GPU-2"]))
    assert chosen is not None
    assert chosen.pod.name == "late"
    done = {(late_uid, "c", RES.gpu)}
    ordered = candidates(pods, RES.gpu, 1, done, set(), ANN.assigned_devices, ANN.assume_time)
    assert [c.pod.name for c in ordered] == ["early"]


def test_malformed_and_finished_pods() -> None:
    bad = pod_object("bad", {"c": {RES.gpu: 1}}, annotations={ANN.assigned_devices: "[1]"})
    gone = pod_object("gone", {"c": {RES.gpu: 1}}, phase="Succeeded")
    pods = [parse_pod(bad), parse_pod(gone)]
    (only,) = candidates(pods, RES.gpu, 1, set(), set(), ANN.assigned_devices, ANN.assume_time)
    assert only.problem is not None
    assert "is malformed" in only.problem


def test_time_keys() -> None:
    assert _time_key("1700000000") == _time_key("1700000000000000000")  # seconds and ns
    assert _time_key("2026-01-01T00:00:00Z") < _time_key("2026-01-01T00:00:01Z")
    assert _time_key(None) > _time_key("1")
    assert _time_key("garbage") == _time_key(None)


def test_best_set_nvlink_then_numa() -> None:
    def dev(i: int, peers: list[int]) -> rpb.Device:
        return rpb.Device(
            id=f"D{i}",
            index=i,
            numa_node=i // 4,
            peers=[
                rpb.Interconnect(peer_id=f"D{p}", kind=rpb.INTERCONNECT_KIND_NVLINK, links=4)
                for p in peers
            ],
        )

    devices = {d.id: d for d in (dev(0, [1]), dev(1, [0]), dev(2, []), dev(4, []), dev(5, []))}
    assert sorted(best_set(devices, [], 2, devices)) == ["D0", "D1"]
    assert sorted(best_set(["D2", "D4", "D5"], [], 2, devices)) == ["D4", "D5"]
    assert best_set(["D0", "D1", "D2"], ["D2"], 2, devices)[0] == "D2"


def test_labels_and_quantities() -> None:
    labels = node_labels([gpu(0), gpu(1)], "v1.14.0", P)
    assert labels[P.labels.device_model] == "A100-SXM4-80GB"
    assert labels[P.labels.device_count] == "2"
    assert labels[P.labels.device_mode] == "tdm"
    mixed = node_labels([gpu(0), gpu(1, rpb.DEVICE_MODE_MIG)], "v1.14.0", P)
    assert mixed[P.labels.device_mode] == "mixed"
    assert label_value("a" * 80 + "!") == "a" * 63
    pod = pod_object("q", {"c": {RES.gpu: 1}})
    pod["spec"]["containers"][0]["resources"]["limits"][RES.core] = "1k"
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "500m"
    limits = parse_pod(pod).containers[0].limits
    assert limits == {RES.gpu: 1, RES.core: 1000}
    assert normalize(DeviceShare("x", 100, 100)) == DeviceShare("x")
    assert normalize(DeviceShare("x", 30, 0)) == DeviceShare("x", 30, 100)
