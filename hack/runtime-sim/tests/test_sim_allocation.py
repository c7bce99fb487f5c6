"""Allocation rules of the simulator, and the injection spec (in-process, no sockets)."""

from __future__ import annotations

import contextlib

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.runtimesim.allocation import (
    AllocationError,
    AllocationRequest,
    Allocator,
    Grant,
)
from lj_runtimekit.runtimesim.injection import build_spec
from lj_runtimekit.runtimesim.inventory import build_inventory
from lj_runtimekit.runtimesim.node import load_node_file, parse_node
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.state import NodeState
from lj_runtimekit.testkit.invariant import sharing_violations

INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def _node(name: str) -> tuple[NodeState, Allocator]:
    node = load_node_file(EXAMPLE_NODES / name)
    state = NodeState(node, build_inventory(node), node.runtime_version)
    return state, Allocator(state)


@pytest.fixture
def mig() -> tuple[NodeState, Allocator]:
    return _node("mig-8gpu.yaml")


def _ask(key: str, *grants: tuple[str, int, int]) -> AllocationRequest:
    return AllocationRequest(
        container_key=key,
        pod_namespace="ns",
        pod_name=key.split("/")[0],
        pod_uid=key.split("/")[0],
        container_name="c",
        grants=tuple(Grant(*g) for g in grants),
    )


def _refused(allocator: Allocator, request: AllocationRequest) -> AllocationError:
    with pytest.raises(AllocationError) as caught:
        allocator.allocate(request)
    return caught.value


def test_slices_sum_to_at_most_100(mig: tuple[NodeState, Allocator]) -> None:
    state, allocator = mig
    gpu = state.devices[0].id
    allocator.allocate(_ask("a/c", (gpu, 60, 30)))
    allocator.allocate(_ask("b/c", (gpu, 40, 30)))
    error = _refused(allocator, _ask("c/c", (gpu, 10, 10)))
    assert error.code == EXHAUSTED
    assert error.message == f"container c/c asks for 10% core of device {gpu}; only 0% is free"
    error = _refused(allocator, _ask("c/c", (gpu, 100, 50)))
    assert "only 0% is free" in error.message
    allocator.release("b/c")
    allocator.allocate(_ask("c/c", (gpu, 40, 70)))
    error = _refused(allocator, _ask("d/c", (gpu, 0 + 100, 100)))
    assert error.code == EXHAUSTED
    assert "whole but it carries slices of a/c, c/c" in error.message


def test_core_only_and_memory_only_slices_hold_only_what_they_name(
    mig: tuple[NodeState, Allocator],
) -> None:
    state, allocator = mig
    gpu = state.devices[0].id
    allocator.allocate(_ask("a/c", (gpu, 30, 0)))
    allocator.allocate(_ask("b/c", (gpu, 0, 100)))
    allocator.allocate(_ask("c/c", (gpu, 70, 0)))
    error = _refused(allocator, _ask("d/c", (gpu, 1, 0)))
    assert "only 0% is free" in error.message


def test_init_containers_overlap_their_own_pod_only(mig: tuple[NodeState, Allocator]) -> None:
    """The kubelet hands an init container's devices to the pod's app containers: they may
    overlap; other pods see the larger of the pod's init and app use."""
    state, allocator = mig
    whole, sliced = state.devices[0].id, state.devices[1].id
    init = _ask("p/init", (whole, 100, 100), (sliced, 60, 20))
    allocator.allocate(AllocationRequest(**{**init.__dict__, "init_container": True}))
    allocator.allocate(_ask("p/main", (whole, 100, 100)))
    allocator.allocate(_ask("p/side", (sliced, 30, 50)))
    error = _refused(allocator, _ask("p/second", (whole, 100, 100)))
    assert "held whole by p/main" in error.message  # app containers never share a device
    # Pod p holds max(init, app) on the sliced device: 60 % core, 50 % memory.
    allocator.allocate(_ask("q/c", (sliced, 40, 50)))
    error = _refused(allocator, _ask("r/c", (sliced, 1, 1)))
    assert "only 0% is free" in error.message
    error = _refused(allocator, _ask("r/c", (whole, 100, 100)))
    assert "held whole by" in error.message


def test_claims_are_holders_of_their_own(mig: tuple[NodeState, Allocator]) -> None:
    """A DRA claim's allocation (key `claim/<uid>`, no pod) is one holder: two claims' slices
    add up on a device, and a claim never overlaps another as init containers of one pod do."""
    state, allocator = mig
    gpu = state.devices[0].id

    def claim(uid: str, core: int, memory: int) -> AllocationRequest:
        return AllocationRequest(
            container_key=f"claim/{uid}",
            pod_namespace="ns",
            pod_name="",
            pod_uid="",
            container_name="",
            grants=(Grant(gpu, core, memory),),
            claim_uid=uid,
            claim_name=f"name-{uid}",
        )

    allocator.allocate(claim("u1", 60, 50))
    allocator.allocate(claim("u2", 40, 50))
    assert allocator.allocate(claim("u1", 60, 50)).request.claim_uid == "u1"  # idempotent
    error = _refused(allocator, claim("u3", 1, 0))
    assert error.message == f"container claim/u3 asks for 1% core of device {gpu}; only 0% is free"
    allocator.release("claim/u1")
    allocator.allocate(claim("u3", 60, 0))


def test_whole_device_is_not_given_twice_nor_sliced(mig: tuple[NodeState, Allocator]) -> None:
    state, allocator = mig
    gpu = state.devices[0].id
    allocator.allocate(_ask("a/c", (gpu, 100, 100)))
    for request in (_ask("b/c", (gpu, 100, 100)), _ask("b/c", (gpu, 10, 10))):
        error = _refused(allocator, request)
        assert error.code == EXHAUSTED
        assert error.message == f"device {gpu} asked for by container b/c is held whole by a/c"


def test_same_request_is_idempotent_other_is_refused(mig: tuple[NodeState, Allocator]) -> None:
    state, allocator = mig
    gpu, other = state.devices[0].id, state.devices[1].id
    first = allocator.allocate(_ask("a/c", (gpu, 50, 50)))
    assert allocator.allocate(_ask("a/c", (gpu, 50, 50))) is first
    assert build_spec(first) == build_spec(allocator.allocate(_ask("a/c", (gpu, 50, 50))))
    error = _refused(allocator, _ask("a/c", (other, 100, 100)))
    assert error.code == PRECONDITION
    assert "container a/c already holds a different allocation" in error.message


@pytest.mark.parametrize(
    ("grants", "code", "message"),
    [
        ([("GPU-x", 100, 100)], INVALID, "container k/c asks for unknown device GPU-x"),
        ([(0, 0, 0)], INVALID, "asks for a slice of device {d0} with 0% core and memory"),
        ([(0, 50, 200)], INVALID, "asks for 200% memory of device {d0}"),
        ([(0, 10, 10), (0, 10, 10)], INVALID, "asks for device {d0} more than once"),
        ([(6, 100, 100)], PRECONDITION, "device {d6} asked for by container k/c is in MIG mode"),
        ([("mig", 50, 50)], PRECONDITION, "asks for a slice of MIG instance {mig}"),
    ],
)
def test_rule_violations(
    mig: tuple[NodeState, Allocator],
    grants: list[tuple[int | str, int, int]],
    code: grpc.StatusCode,
    message: str,
) -> None:
    state, allocator = mig
    names = {f"d{i}": d.id for i, d in enumerate(state.devices)}
    names["mig"] = state.devices[6].mig_instances[0].id
    resolved = [
        (names.get(f"d{d}" if isinstance(d, int) else d, str(d)), c, m) for d, c, m in grants
    ]
    error = _refused(allocator, _ask("k/c", *resolved))
    assert error.code == code
    assert message.format(**names) in error.message
    assert not allocator.allocations()


def test_exclusive_devices_are_not_sliced() -> None:
    node = parse_node(
        "name: n\nruntimeVersion: v1.14.0\n"
        "devices: [{kind: amd, model: MI300X, memory: 192Gi, count: 2}]\n",
        "n.yaml",
    )
    state = NodeState(node, build_inventory(node), node.runtime_version)
    allocator = Allocator(state)
    amd = state.devices[1].id
    error = _refused(allocator, _ask("k/c", (amd, 50, 50)))
    assert error.code == PRECONDITION
    assert f"slice of exclusive-mode device {amd}" in error.message
    spec = build_spec(allocator.allocate(_ask("k/c", (amd, 100, 100))))
    assert [n.host_path for n in spec.device_nodes] == ["/dev/dri/renderD129", "/dev/kfd"]
    assert "NVIDIA_VISIBLE_DEVICES" not in spec.envs
    assert list(spec.cdi_devices) == [f"lingjun.com/amd={amd}"]


def test_unhealthy_mig_parent_refuses_instances(mig: tuple[NodeState, Allocator]) -> None:
    state, allocator = mig
    parent = state.devices[7]
    state.set_health(parent.id, healthy=False, reason="XID 79")
    error = _refused(allocator, _ask("k/c", (parent.mig_instances[1].id, 100, 100)))
    assert error.code == PRECONDITION
    assert error.message.endswith("is unhealthy: XID 79")


def test_mig_instance_is_given_once(mig: tuple[NodeState, Allocator]) -> None:
    state, allocator = mig
    instance = state.devices[7].mig_instances[0].id
    allocator.allocate(_ask("a/c", (instance, 100, 100)))
    assert _refused(allocator, _ask("b/c", (instance, 100, 100))).code == EXHAUSTED
    allocator.allocate(_ask("b/c", (state.devices[7].mig_instances[1].id, 100, 100)))


def test_spec_for_several_devices_and_ppus() -> None:
    state, allocator = _node("ppu-16.yaml")
    first, second = state.devices[3].id, state.devices[12].id
    spec = build_spec(allocator.allocate(_ask("p/c", (first, 100, 100), (second, 30, 40))))
    assert spec.envs["LJ_VISIBLE_DEVICES"] == f"{first},{second}"
    assert spec.envs["LJ_DEVICE_CORE_PERCENT"] == "100,30"
    assert spec.envs["LJ_DEVICE_MEMORY_PERCENT"] == "100,40"
    assert [n.host_path for n in spec.device_nodes] == ["/dev/ppu3", "/dev/ppu12"]
    assert [(m.host_path, m.read_only) for m in spec.mounts] == [
        ("/run/amp/eKitC/xdm/lib/ppu", True)
    ]
    assert list(spec.cdi_devices) == [f"lingjun.com/ppu={first}", f"lingjun.com/ppu={second}"]
    assert spec.annotations["lingjun.com/devices"] == f"{first},{second}"
    assert spec.annotations["lingjun.com/pod-namespace"] == "ns"


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "release"]),
        st.integers(0, 5),  # container
        st.integers(0, 2),  # device (0-1 TDM, 2 the first MIG instance of GPU 6)
        st.sampled_from([0, 1, 30, 50, 70, 100, 101]),
        st.sampled_from([0, 1, 30, 50, 70, 100, 101]),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_sharing_invariant_holds_for_any_sequence(
    ops: list[tuple[str, int, int, int, int]],
) -> None:
    state, allocator = _node("mig-8gpu.yaml")
    targets = [state.devices[0].id, state.devices[1].id, state.devices[6].mig_instances[0].id]
    for op, container, device, core, memory in ops:
        key = f"pod-{container}/c"
        if op == "release":
            allocator.release(key)
            continue
        with contextlib.suppress(AllocationError):
            allocator.allocate(_ask(key, (targets[device], core or 100, memory or 100)))
        holdings = [  # (node, holder, share)
            (
                "sim",
                a.request.container_key,
                DeviceShare(g.device_id, g.core_percent, g.memory_percent),
            )
            for a in allocator.allocations()
            for g in a.request.grants
        ]
        assert sharing_violations("simulator", holdings) == []
