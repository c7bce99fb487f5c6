"""Pure logic: resources, candidate resolution, topology, labels, pod parsing."""

from __future__ import annotations

from lj_runtimekit.deviceplugin.internal.allocate.resolve import next_container, waiting_pods
from lj_runtimekit.deviceplugin.internal.allocate.topology import best_set
from lj_runtimekit.deviceplugin.internal.nodelabels.labels import label_value, node_labels
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import PodInfo, parse_pod, parse_pod_list
from lj_runtimekit.deviceplugin.internal.rm.resources import (
    build_inventory,
    resource_info,
    slice_unit_device,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg.featuregate import evaluate
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID
from lj_runtimekit.proto.pkg.runtimeclient import from_request, normalize, to_request
from lj_runtimekit.proto.pkg.version import Version
from lj_runtimekit.testkit.podserver import pod_object

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


def _pod(name: str, containers: dict[str, dict[str, int]], **ann: str) -> PodInfo:
    return parse_pod(pod_object(name, containers, annotations=dict(ann)))


def test_waiting_pods_and_kubelet_container_order() -> None:
    """The pod waiting for devices is the active one not yet served; containers go init
    first, in spec order, and a served (container, resource) is skipped."""
    served = {RES.gpu, RES.core, RES.memory}.__contains__
    text = encode_assignment({"c": (DeviceShare("GPU-1"),)})
    allocated = _pod("done", {"c": {RES.gpu: 1}}, **{ANN.bind_phase: "allocated"})
    finished = parse_pod(pod_object("gone", {"c": {RES.gpu: 1}}, phase="Failed"))
    cpu_only = _pod("cpu", {"c": {"cpu": 1}})
    wanted = _pod("want", {"c": {RES.gpu: 1}}, **{ANN.assigned_devices: text})
    pods = [allocated, finished, cpu_only, wanted]
    (only,) = waiting_pods(pods, served, set(), ANN.assigned_devices, ANN.bind_phase)
    assert only.pod.name == "want"
    assert only.assignment == {"c": (DeviceShare("GPU-1"),)}
    done = {(wanted.uid, "c", RES.gpu)}
    assert waiting_pods(pods, served, done, ANN.assigned_devices, ANN.bind_phase) == []

    obj = pod_object("init", {"main": {RES.gpu: 1}, "side": {RES.core: 20, RES.memory: 10}})
    obj["spec"]["initContainers"] = [
        {"name": "prep", "resources": {"limits": {RES.gpu: 1}}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {RES.gpu: 1}}},
    ]
    pod = parse_pod(obj)
    assert [(c.name, c.run_to_completion, c.sidecar) for c in pod.containers[:2]] == [
        ("prep", True, False),
        ("proxy", False, True),
    ]
    first = next_container(pod, RES.gpu, set())
    assert first is not None
    assert first.name == "prep"
    second = next_container(pod, RES.gpu, {(pod.uid, "prep", RES.gpu)})
    assert second is not None
    assert second.name == "proxy"
    side = next_container(pod, RES.memory, set())
    assert side is not None
    assert side.name == "side"


def _own_pod(assignment: str) -> PodInfo:
    """A pod carrying `assignment` with its own UID, as the scheduler writes it."""
    annotations = {ANN.assigned_devices: assignment, ASSIGNED_POD_UID: "uid-own"}
    return parse_pod(pod_object("own", {"c": {RES.gpu: 1}}, uid="uid-own", annotations=annotations))


def test_an_assignment_copied_from_another_pod_waits_with_its_problem() -> None:
    """A pod carrying another pod's assignment (UID of that pod) is not served it, and a
    copied `allocated` phase does not hide it: it is the pod waiting, with the reason. An
    assignment without a UID (an older scheduler's) is the pod's own."""
    served = {RES.gpu}.__contains__
    text = encode_assignment({"c": (DeviceShare("GPU-1"),)})
    for phase in ("allocating", "allocated"):
        ann = {ANN.assigned_devices: text, ANN.bind_phase: phase, ASSIGNED_POD_UID: "uid-orig"}
        forged = _pod("forged", {"c": {RES.gpu: 1}}, **ann)
        (only,) = waiting_pods([forged], served, set(), ANN.assigned_devices, ANN.bind_phase)
        assert only.assignment is None
        assert only.problem is not None
        assert "written by the scheduler for the pod with UID uid-orig" in only.problem
        assert f"not for this one ({forged.uid})" in only.problem
    own = _own_pod(text)
    older = _pod("older", {"c": {RES.gpu: 1}}, **{ANN.assigned_devices: text})
    for pod in (own, older):
        (only,) = waiting_pods([pod], served, set(), ANN.assigned_devices, ANN.bind_phase)
        assert only.problem is None
        assert only.assignment == {"c": (DeviceShare("GPU-1"),)}


def test_required_uid_makes_an_assignment_without_one_wait_with_its_problem() -> None:
    """With require_uid an assignment naming no pod (an older scheduler's, or a copy whose UID
    was removed) is not served, whatever its phase; one with the pod's own UID is."""
    served = {RES.gpu}.__contains__
    text = encode_assignment({"c": (DeviceShare("GPU-1"),)})
    for phase in ("allocating", "allocated"):
        ann = {ANN.assigned_devices: text, ANN.bind_phase: phase}
        stripped = _pod("stripped", {"c": {RES.gpu: 1}}, **ann)
        (only,) = waiting_pods(
            [stripped], served, set(), ANN.assigned_devices, ANN.bind_phase, require_uid=True
        )
        assert only.assignment is None
        assert only.problem is not None
        assert f"{ASSIGNED_POD_UID} is missing" in only.problem
    own = _own_pod(text)
    (only,) = waiting_pods(
        [own], served, set(), ANN.assigned_devices, ANN.bind_phase, require_uid=True
    )
    assert only.problem is None
    assert only.assignment == {"c": (DeviceShare("GPU-1"),)}


def test_malformed_assignment_and_empty_pod_list() -> None:
    served = {RES.gpu}.__contains__
    bad = _pod("bad", {"c": {RES.gpu: 1}}, **{ANN.assigned_devices: "[1]"})
    (only,) = waiting_pods([bad], served, set(), ANN.assigned_devices, ANN.bind_phase)
    assert only.problem is not None
    assert "is malformed" in only.problem
    # An empty node's kubelet answers `"items": null`: a valid, empty list.
    assert parse_pod_list(b'{"kind":"PodList","items":null}', "kubelet") == []


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
    # A core-only slice stays core-only on the wire and back (0 % memory, not the whole).
    core_only = DeviceShare("x", 30, 0)
    assert normalize(core_only) == core_only
    assert from_request(to_request(core_only)) == core_only
    assert from_request(to_request(DeviceShare("x"))) == DeviceShare("x")
    legacy = rpb.DeviceRequest(device_id="x", core_percent=30)
    assert from_request(legacy) == DeviceShare("x", 30, 100)
