"""The DRA allocator on the driver's own slices and DeviceClasses (slices.py, classes.py):
whole devices, TDM shares by capacity, MIG instances, constraints, prioritized lists,
taints, and the ledger that keeps two claims off one device."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes, profile_selector
from lj_runtimekit.deviceplugin.internal.dra.slices import build_slices
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.schedulerframework.internal.dra import allocator
from lj_runtimekit.schedulerframework.internal.dra.allocator import (
    ClaimProblem,
    allocate,
    check_claim,
    copies_that_fit,
)
from lj_runtimekit.schedulerframework.internal.dra.objects import (
    Allocation,
    Claim,
    RequestPolicy,
    allocation_to_api,
)
from lj_runtimekit.schedulerframework.internal.dra.state import DraState
from lj_runtimekit.testkit.dra import exactly, example_devices, synthetic_gpus

P = load_protocol()
DRIVER = P.dra.driver
WHOLE = P.dra.whole_class("gpu")
SHARE = P.dra.share_class("gpu")
_UIDS = itertools.count()


def cluster(nodes: Mapping[str, Sequence[pb.Device]]) -> DraState:
    state = DraState()
    for c in device_classes(P, extended_resources=False):
        state.update_class(c)
    for node, devices in nodes.items():
        for obj in build_slices(devices, node_name=node, protocol=P, generation=1, apart=True):
            state.update_slice(obj)
    return state


def claim(state: DraState, *requests: dict[str, Any], **devices: Any) -> Claim:
    n = next(_UIDS)
    obj = {
        "metadata": {"name": f"c{n}", "namespace": "ns", "uid": f"uid-{n}", "resourceVersion": "1"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }
    return state.update_claim(obj)


def place(state: DraState, node: str, *claims: Claim) -> list[list[tuple[str, dict[str, str]]]]:
    """Allocates and assumes the claims on the node: each claim's (device, consumed)."""
    for c in claims:
        assert check_claim(c, state) is None
    planned, why = allocate(state, node, claims)
    assert planned is not None, why
    for item in planned:
        state.assume(item.claim, Allocation(node, item.results))
    assert state.overcommitted() == []
    return [
        [(r.device, {k: str(v) for k, v in r.consumed.items()}) for r in item.results]
        for item in planned
    ]


def refused(state: DraState, node: str, *claims: Claim) -> str:
    planned, why = allocate(state, node, claims)
    assert planned is None
    return why


def test_whole_gpus_are_held_by_one_claim_each() -> None:
    state = cluster({"n": synthetic_gpus(4, pb.DEVICE_MODE_EXCLUSIVE)})
    first = place(state, "n", claim(state, exactly("g", WHOLE, count=3)))
    second = place(state, "n", claim(state, exactly("g", WHOLE)))
    devices = [d for item in first + second for d, _ in item]
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert "cannot allocate ResourceClaim(s) ns/c" in refused(
        state, "n", claim(state, exactly("g", WHOLE))
    )


def test_tdm_shares_pack_one_gpu_and_leave_whole_gpus_free() -> None:
    state = cluster({"n": synthetic_gpus(2, pb.DEVICE_MODE_TDM)})
    share = exactly("s", SHARE, capacity={"cores": "30", "memory": "20Gi"})
    placed = [place(state, "n", claim(state, share))[0][0] for _ in range(3)]
    assert {d for d, _ in placed} == {"gpu-0"}  # binpack: the fullest GPU that fits
    # 20Gi of 80 GiB rounds up to 25 steps of 1 % (858993460 bytes)
    assert placed[0][1] == {"cores": "30", "memory": str(25 * 858993460)}
    (whole,) = place(state, "n", claim(state, exactly("g", WHOLE)))
    assert whole[0][0] == "gpu-1"  # a whole request takes all capacity: only a free GPU
    assert "cannot allocate" in refused(state, "n", claim(state, share))
    # the fourth 30 % share no longer fits gpu-0 (90 % used) nor gpu-1 (whole)


def test_share_without_capacity_takes_the_whole_device() -> None:
    state = cluster({"n": synthetic_gpus(1, pb.DEVICE_MODE_TDM)})
    ((_, consumed),) = place(state, "n", claim(state, exactly("s", SHARE)))[0]
    assert consumed["cores"] == "100"
    refused(state, "n", claim(state, exactly("s", SHARE, capacity={"cores": "1"})))


def test_mig_instances_of_a_profile_never_twice() -> None:
    devices = example_devices("mig-8gpu", "m")
    state = cluster({"m": devices})
    profile = next(i.profile for d in devices for i in d.mig_instances)
    count = sum(1 for d in devices for i in d.mig_instances if i.profile == profile)
    request = exactly("m", P.dra.mig_class, selector=profile_selector(P, profile))
    got = [place(state, "m", claim(state, request))[0][0][0] for _ in range(count)]
    assert len(set(got)) == count
    refused(state, "m", claim(state, request))


def test_match_attribute_keeps_a_claim_on_one_nvlink_domain() -> None:
    devices = example_devices("tdm-8gpu", "n")
    state = cluster({"n": devices})
    domain = f"{DRIVER}/nvlinkDomain"
    constraint = [{"requests": [], "matchAttribute": domain}]
    ((placed),) = place(
        state, "n", claim(state, exactly("g", WHOLE, count=2), constraints=constraint)
    )
    values = {state.device((DRIVER, "n", d)).attribute(domain) for d, _ in placed}  # type: ignore[union-attr]
    assert len(values) == 1


def test_first_available_falls_back_to_the_next_subrequest() -> None:
    state = cluster({"n": synthetic_gpus(2, pb.DEVICE_MODE_TDM)})
    place(state, "n", claim(state, exactly("g", WHOLE)))  # one GPU left: two do not fit
    request = {
        "name": "r",
        "firstAvailable": [
            {"name": "two", "deviceClassName": WHOLE, "count": 2},
            {"name": "one", "deviceClassName": WHOLE, "count": 1},
        ],
    }
    planned, why = allocate(state, "n", [claim(state, request)])
    assert planned is not None, why
    assert [r.request for r in planned[0].results] == ["r/one"]


def test_all_mode_needs_every_matching_device_free() -> None:
    state = cluster({"n": synthetic_gpus(3, pb.DEVICE_MODE_EXCLUSIVE)})
    every = {"name": "a", "exactly": {"deviceClassName": WHOLE, "allocationMode": "All"}}
    (placed,) = place(state, "n", claim(state, every))
    assert len(placed) == 3
    state = cluster({"n": synthetic_gpus(3, pb.DEVICE_MODE_EXCLUSIVE)})
    place(state, "n", claim(state, exactly("g", WHOLE)))
    refused(state, "n", claim(state, every))


def test_tainted_device_only_with_a_toleration() -> None:
    devices = synthetic_gpus(1, pb.DEVICE_MODE_EXCLUSIVE)
    devices[0].health = pb.HEALTH_UNHEALTHY
    state = cluster({"n": devices})
    refused(state, "n", claim(state, exactly("g", WHOLE)))
    tolerating = exactly("g", WHOLE)
    tolerating["exactly"]["tolerations"] = [{"operator": "Exists"}]
    place(state, "n", claim(state, tolerating))


def test_claims_no_node_can_serve_are_named() -> None:
    state = cluster({"n": synthetic_gpus(1, pb.DEVICE_MODE_EXCLUSIVE)})
    bad = claim(state, exactly("g", WHOLE, selector="device.attributes["))
    with pytest.raises(ClaimProblem, match=r"ns/c\d+ request g: CEL selector .* does not compile"):
        check_claim(bad, state)
    other = claim(state, exactly("g", WHOLE, selector="request.x == 1"))
    with pytest.raises(ClaimProblem, match="only the variable device"):
        check_claim(other, state)
    admin = exactly("g", WHOLE)
    admin["exactly"]["adminAccess"] = True
    with pytest.raises(ClaimProblem, match="admin access is not served"):
        check_claim(claim(state, admin), state)
    missing = claim(state, exactly("g", "nvidia.com-gpu"))
    assert "DeviceClass 'nvidia.com-gpu' not found" in str(check_claim(missing, state))


def test_selector_failing_at_run_time_does_not_match() -> None:
    state = cluster({"n": synthetic_gpus(1, pb.DEVICE_MODE_EXCLUSIVE)})
    lacking = claim(state, exactly("g", WHOLE, selector=f'device.attributes["{DRIVER}"].nope == 1'))
    assert check_claim(lacking, state) is None
    assert "nope" in refused(state, "n", lacking)
    quantity = claim(
        state,
        exactly(
            "g",
            WHOLE,
            selector=f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
        ),
    )
    place(state, "n", quantity)


def test_the_ledger_follows_the_claims_not_the_assumptions() -> None:
    state = cluster({"n": synthetic_gpus(1, pb.DEVICE_MODE_EXCLUSIVE)})
    c = claim(state, exactly("g", WHOLE))
    (results,) = [item.results for item in allocate(state, "n", [c])[0] or ()]
    state.assume(c, Allocation("n", results))
    assert state.holders((DRIVER, "n", "gpu-0")) == [c.uid]
    # the claim shows the allocation: it counts once, and forgetting the attempt keeps it
    obj = dict(state.claim_objects[c.key])
    obj["metadata"] = {**obj["metadata"], "resourceVersion": "5"}
    obj["status"] = {"allocation": allocation_to_api("n", results, (), "2026-01-01T00:00:00Z")}
    state.update_claim(obj)
    state.forget(c.uid)
    assert state.holders((DRIVER, "n", "gpu-0")) == [c.uid]
    # a watch event older than what this scheduler wrote is ignored
    stale = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "4"}, "status": {}}
    state.update_claim(stale)
    assert state.holders((DRIVER, "n", "gpu-0")) == [c.uid]
    state.remove_claim(c.key)
    assert state.holders((DRIVER, "n", "gpu-0")) == []


def test_devices_in_use_follow_the_ledger_through_slice_changes() -> None:
    state = cluster({"a": synthetic_gpus(4, pb.DEVICE_MODE_EXCLUSIVE)})

    def counted() -> dict[str, int]:
        return {node: state.devices_in_use(node) for node in ("a", "b")}

    def recounted() -> dict[str, int]:
        return {
            node: sum(1 for d in state.node_devices.get(node, ()) if state.usage(d.key))
            for node in ("a", "b")
        }

    # a claim allocated on node b before b's slices are seen counts once they are
    other = cluster({"b": synthetic_gpus(2, pb.DEVICE_MODE_EXCLUSIVE)})
    early = claim(other, exactly("g", WHOLE))
    planned, why = allocate(other, "b", [early])
    assert planned is not None, why
    state.assume(early, Allocation("b", planned[0].results))
    assert counted() == recounted() == {"a": 0, "b": 0}
    for obj in build_slices(
        synthetic_gpus(2, pb.DEVICE_MODE_EXCLUSIVE), node_name="b", protocol=P, generation=1
    ):
        state.update_slice(obj)
    assert counted() == recounted() == {"a": 0, "b": 1}
    held = [claim(state, exactly("g", WHOLE)) for _ in range(3)]
    place(state, "a", *held)
    assert counted() == recounted() == {"a": 3, "b": 1}
    assert state.rank_by_room(["a", "b"]) == ["a", "b"]
    # a newer generation drops two devices, one of them held: the count follows the slice
    for obj in build_slices(
        synthetic_gpus(2, pb.DEVICE_MODE_EXCLUSIVE), node_name="a", protocol=P, generation=2
    ):
        state.update_slice(obj)
    assert counted() == recounted() == {"a": 2, "b": 1}
    assert state.rank_by_room(["a", "b"]) == ["b"]  # a has no free device left
    for c in [*held, early]:
        state.forget(c.uid)
    assert counted() == recounted() == {"a": 0, "b": 0}


def test_newer_pool_generation_replaces_the_devices() -> None:
    state = cluster({"n": synthetic_gpus(2, pb.DEVICE_MODE_EXCLUSIVE)})
    for obj in build_slices(
        synthetic_gpus(1, pb.DEVICE_MODE_EXCLUSIVE), node_name="n", protocol=P, generation=2
    ):
        state.update_slice(obj)
    assert [d.name for d in state.node_devices["n"]] == ["gpu-0"]


def test_request_policy_rounds_up_to_a_valid_amount() -> None:
    d = Decimal
    steps = RequestPolicy(default=d(100), minimum=d(10), maximum=d(80), step=d(5))
    assert steps.consumed(None, d(100)) is None  # the default is past the maximum
    assert steps.consumed(d(3), d(100)) == d(10)
    assert steps.consumed(d(11), d(100)) == d(15)
    assert steps.consumed(d(81), d(100)) is None
    values = RequestPolicy(valid_values=(d(40), d(20)))
    assert values.consumed(d(21), d(100)) == d(40)
    assert values.consumed(d(41), d(100)) is None
    assert RequestPolicy().consumed(None, d(7)) == d(7)


def test_copies_that_fit_counts_a_gang_members_per_node_and_holds_nothing() -> None:
    state = cluster({"n": synthetic_gpus(8, pb.DEVICE_MODE_EXCLUSIVE)})
    place(state, "n", claim(state, exactly("g", WHOLE, count=2)))  # 6 GPUs left
    member = claim(state, exactly("g", WHOLE, count=2))
    assert copies_that_fit(state, "n", [member], 10) == 3
    assert copies_that_fit(state, "n", [member], 2) == 2
    assert not any("/copy-" in uid for uid in state.assumed)
    assert len([d for d in state.node_devices["n"] if state.usage(d.key)]) == 2


def test_a_changed_device_class_selects_anew() -> None:
    state = cluster({"n": synthetic_gpus(2, pb.DEVICE_MODE_EXCLUSIVE)})
    # the node's selection for the class is memoized; the claim takes one GPU
    (((taken, _),),) = place(state, "n", claim(state, exactly("g", WHOLE)))
    (whole,) = [
        c for c in device_classes(P, extended_resources=False) if c["metadata"]["name"] == WHOLE
    ]
    index = state.device((DRIVER, "n", taken)).attribute("index")  # type: ignore[union-attr]
    only_taken = {"cel": {"expression": f'device.attributes["{DRIVER}"].index == {index}'}}
    selectors = [*whole["spec"].get("selectors", ()), only_taken]
    state.update_class({**whole, "spec": {**whole["spec"], "selectors": selectors}})
    assert refused(state, "n", claim(state, exactly("g", WHOLE)))
    state.update_class(whole)
    place(state, "n", claim(state, exactly("g", WHOLE)))


def test_the_device_selection_memo_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "MAX_DEVICE_SELECTIONS", 3)
    state = cluster({f"n{i}": synthetic_gpus(1, pb.DEVICE_MODE_EXCLUSIVE) for i in range(5)})
    c = claim(state, exactly("g", WHOLE))
    for i in range(5):
        place(state, f"n{i}", c)
        state.forget(c.uid)
        assert len(state.devices_matching) <= 3
