"""Plugin decisions on the in-memory framework (FakeCluster plays the API server)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

from pytest_mock import MockerFixture

from lj_runtimekit.proto.pkg.protocol import decode_assignment
from lj_runtimekit.schedulerframework.internal.cache.podinfo import parse_pod
from lj_runtimekit.schedulerframework.internal.extender.server import Extender
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.assign import copies_that_fit
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import (
    parse_device_request,
)
from lj_runtimekit.schedulerframework.internal.plugins.tainttoleration import TaintToleration
from lj_runtimekit.testkit.scheduler.fake import (
    CORE,
    GPU,
    MEM,
    PROTOCOL,
    FakeCluster,
    nvlink_inventory,
    preferred_affinity,
)
from lj_runtimekit.testkit.waits import wait_for

POLICY = PROTOCOL.annotations.gpu_policy
NO_BACKOFF = {"podInitialBackoffSeconds": 0.001, "podMaxBackoffSeconds": 0.001}
"""Pods moved back by a cluster change are tried again at once."""
MakeCluster = Callable[[Mapping[str, Any] | None], FakeCluster]


def test_whole_gpu_binpack_fills_the_fullest_node(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    cluster.add_node("b")
    first = cluster.add_pod("p1", {GPU: "2"})
    cluster.schedule()
    second = cluster.add_pod("p2", {GPU: "2"})
    cluster.schedule()
    assert cluster.node_of(first) == cluster.node_of(second)
    devices = (
        decode_assignment(cluster.assignment(first))["c0"]
        + decode_assignment(cluster.assignment(second))["c0"]
    )
    assert len({d.device_id for d in devices}) == 4
    assert all(d.whole for d in devices)


def test_spread_policy_and_per_pod_override(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(
        {"profiles": [{"pluginConfig": [{"name": "GpuShare", "args": {"policy": "spread"}}]}]}
    )
    c.add_node("a")
    c.add_node("b")
    p1 = c.add_pod("p1", {GPU: "1"})
    c.schedule()
    p2 = c.add_pod("p2", {GPU: "1"})
    c.schedule()
    assert c.node_of(p1) != c.node_of(p2)
    p3 = c.add_pod("p3", {GPU: "1"}, annotations={POLICY: "binpack"})
    c.schedule()
    assert c.node_of(p3) in (c.node_of(p1), c.node_of(p2))


def test_slices_share_a_device_up_to_100_percent(cluster: FakeCluster) -> None:
    cluster.add_node("a", gpus=1)
    uids = [cluster.add_pod(f"s{i}", {CORE: "40", MEM: "30"}) for i in range(3)]
    cluster.schedule()
    placed = [u for u in uids if cluster.node_of(u)]
    assert len(placed) == 2  # 3 x 40 % of cores would exceed 100 %
    shares = [decode_assignment(cluster.assignment(u))["c0"][0] for u in placed]
    assert {s.device_id for s in shares} == {"0"}
    assert all((s.core_percent, s.memory_percent) == (40, 30) for s in shares)
    pending = next(u for u in uids if u not in placed)
    assert cluster.events(pending, "FailedScheduling") == [
        "0/1 nodes are available: 1 node(s) had no GPU with the asked core and memory "
        "percentage free. preemption: 0/1 nodes are available: 1 No preemption victims found "
        "for incoming pod."
    ]
    assert cluster.scheduler.cache.violations() == []


def test_a_slice_needs_both_core_and_memory_room(cluster: FakeCluster) -> None:
    # The PreFilter index ranks by free core %, and the node's memory % in all (200) has
    # room for 30 more; the Filter must still find no single GPU with 30 % memory free.
    cluster.add_node("a", gpus=2)
    heavy = [cluster.add_pod(f"mem-heavy{i}", {CORE: "10", MEM: "80"}) for i in range(2)]
    cluster.schedule()
    second = cluster.add_pod("more-mem", {CORE: "10", MEM: "30"})
    third = cluster.add_pod("fits", {CORE: "10", MEM: "20"})
    cluster.schedule()
    assert [cluster.node_of(u) for u in heavy] == ["a", "a"]
    assert cluster.node_of(second) == ""
    assert cluster.events(second, "FailedScheduling") == [
        "0/1 nodes are available: 1 node(s) had no GPU with the asked core and memory "
        "percentage free. preemption: 0/1 nodes are available: 1 No preemption victims found "
        "for incoming pod."
    ]
    assert cluster.node_of(third) == "a"
    assert cluster.scheduler.cache.violations() == []


def test_whole_device_carries_no_slice(cluster: FakeCluster) -> None:
    cluster.add_node("a", gpus=2)
    s = cluster.add_pod("slice", {CORE: "10", MEM: "10"})
    cluster.schedule()
    w = cluster.add_pod("whole", {GPU: "2"})
    cluster.schedule()
    assert cluster.node_of(s) == "a"
    assert cluster.node_of(w) == ""  # one GPU carries a slice: only one is free whole
    w1 = cluster.add_pod("whole1", {GPU: "1"})
    cluster.schedule()
    whole_dev = decode_assignment(cluster.assignment(w1))["c0"][0].device_id
    slice_dev = decode_assignment(cluster.assignment(s))["c0"][0].device_id
    assert whole_dev != slice_dev
    s2 = cluster.add_pod("slice2", {CORE: "10", MEM: "10"})
    cluster.schedule()
    assert decode_assignment(cluster.assignment(s2))["c0"][0].device_id == slice_dev
    assert cluster.scheduler.cache.violations() == []


def test_mig_and_tdm_never_on_one_gpu(cluster: FakeCluster) -> None:
    mig_res = PROTOCOL.resources.mig("3g.40gb")
    inv = nvlink_inventory("a", count=2, groups=1, mig={1: ["3g.40gb", "4g.40gb"]})
    cluster.add_node("a", gpus=2, inventory=inv, extra={mig_res: "1"})
    m = cluster.add_pod("mig", {mig_res: "1"})
    slices = [cluster.add_pod(f"s{i}", {CORE: "50", MEM: "50"}) for i in range(3)]
    whole = cluster.add_pod("w", {GPU: "1"})
    cluster.schedule()
    assert decode_assignment(cluster.assignment(m))["c0"][0].device_id == "a-gpu1-mig0"
    placed = [u for u in slices if cluster.node_of(u)]
    assert len(placed) == 2
    for u in placed:
        assert decode_assignment(cluster.assignment(u))["c0"][0].device_id == "a-gpu0"
    assert cluster.node_of(whole) == ""  # gpu0 carries slices, gpu1 is in MIG mode
    m2 = cluster.add_pod("mig2", {mig_res: "1"})
    cluster.schedule()
    assert cluster.node_of(m2) == ""  # the only 3g.40gb instance is taken
    assert cluster.scheduler.cache.violations() == []


def test_a_gpu_switching_mode_is_not_shared_by_tdm_and_mig(make_cluster: MakeCluster) -> None:
    """The inventory switches a GPU's mode under a pod still holding it: the GPU is not handed
    out in the other mode until that pod is gone."""
    cluster = make_cluster(NO_BACKOFF)
    mig_res = PROTOCOL.resources.mig("3g.40gb")
    cluster.add_node("a", gpus=2, inventory=nvlink_inventory("a", count=2, groups=1))
    tdm = cluster.add_pod("slice", {CORE: "30", MEM: "30"})
    cluster.schedule()
    assert decode_assignment(cluster.assignment(tdm))["c0"][0].device_id == "a-gpu0"
    to_mig = nvlink_inventory("a", count=2, groups=1, mig={0: ["3g.40gb", "3g.40gb"]})
    cluster.add_node("a", gpus=2, inventory=to_mig, extra={mig_res: "2"})
    mig = cluster.add_pod("mig", {mig_res: "1"})
    cluster.schedule()
    assert cluster.node_of(mig) == ""  # gpu0 still carries the slice
    cluster.delete_pod(tdm)
    time.sleep(0.01)
    cluster.schedule()
    assert decode_assignment(cluster.assignment(mig))["c0"][0].device_id == "a-gpu0-mig0"
    # back to TDM while the MIG instance is in use: no slice, no whole GPU on gpu0
    cluster.add_node("a", gpus=2, inventory=nvlink_inventory("a", count=2, groups=1))
    whole = cluster.add_pod("whole", {GPU: "2"})
    later = cluster.add_pod("later", {CORE: "30", MEM: "30"})
    cluster.schedule()
    assert cluster.node_of(whole) == ""
    assert decode_assignment(cluster.assignment(later))["c0"][0].device_id == "a-gpu1"
    cluster.delete_pod(mig)
    cluster.delete_pod(later)
    time.sleep(0.01)
    cluster.schedule()
    assert cluster.node_of(whole) == "a"
    assert cluster.scheduler.cache.violations() == []


def test_copies_that_fit_count_the_devices_one_by_one(cluster: FakeCluster) -> None:
    mig_res = PROTOCOL.resources.mig("1g.10gb")
    inv = nvlink_inventory("a", mig={7: ["1g.10gb"] * 3})
    cluster.add_node("a", inventory=inv, extra={mig_res: "3"})
    cluster.add_pod("taken", {CORE: "50", MEM: "50"})
    cluster.schedule()  # gpu0 half used

    def fit(
        containers: list[Mapping[str, str]], init: list[Mapping[str, str]] | None = None
    ) -> int:
        pod = parse_pod(
            {
                "metadata": {"name": "p", "namespace": "default", "uid": "u"},
                "spec": {
                    "containers": [
                        {"name": f"c{i}", "resources": {"limits": dict(c)}}
                        for i, c in enumerate(containers)
                    ],
                    "initContainers": [
                        {"name": f"i{i}", "resources": {"limits": dict(c)}}
                        for i, c in enumerate(init or [])
                    ],
                },
            }
        )
        req = parse_device_request(pod, PROTOCOL)
        assert req is not None
        return copies_that_fit(cluster.scheduler.cache.nodes["a"].devices, req, "binpack", 100)

    assert fit([{CORE: "60", MEM: "10"}]) == 6  # one per free TDM GPU, none on gpu0
    assert fit([{CORE: "25", MEM: "10"}]) == 2 + 6 * 4
    assert fit([{CORE: "60"}, {CORE: "60"}]) == 3  # a pod's two slices need two GPUs
    assert fit([{CORE: "30"}], init=[{CORE: "60"}]) == 6  # together on one GPU: 60 % each
    assert fit([{mig_res: "2"}]) == 1
    assert fit([{GPU: "2"}, {CORE: "50"}]) == 2  # 2 whole + a slice: 3 GPUs and gpu0's half


def test_topology_picks_an_nvlink_island_then_numa(cluster: FakeCluster) -> None:
    cluster.add_node("a", inventory=nvlink_inventory("a"))
    p = cluster.add_pod("p1", {GPU: "1"})
    cluster.schedule()
    assert decode_assignment(cluster.assignment(p))["c0"][0].device_id == "a-gpu0"
    q = cluster.add_pod("p4", {GPU: "4"})
    cluster.schedule()
    ids = sorted(d.device_id for d in decode_assignment(cluster.assignment(q))["c0"])
    # gpu0 is taken, so island 0 has 3 free: the 4-set must be the whole island 1
    assert ids == [f"a-gpu{i}" for i in range(4, 8)]


def test_topology_prefers_the_node_with_a_whole_island(cluster: FakeCluster) -> None:
    cluster.add_node("a", inventory=nvlink_inventory("a"), labels={"host": "a"})
    cluster.add_node("b", inventory=nvlink_inventory("b"))
    # node a runs a pod holding one GPU of each NVLink island: no 4-island left there
    cluster.add_bound_pod("old", "a", '{"c0":[{"id":"a-gpu0"},{"id":"a-gpu4"}]}', 2)
    q = cluster.add_pod("p4", {GPU: "4"})
    cluster.schedule()
    assert cluster.node_of(q) == "b"
    single = cluster.add_pod("p1", {GPU: "1"}, nodeSelector={"host": "a"})
    cluster.schedule()
    # a single device comes from an already broken island (gpu1..3 and gpu5..7 tie)
    assert decode_assignment(cluster.assignment(single))["c0"][0].device_id == "a-gpu1"
    q2 = cluster.add_pod("p4b", {GPU: "4"})
    cluster.schedule()
    assert cluster.node_of(q2) == "b"  # b still has a whole island; a has none


def test_core_predicates(cluster: FakeCluster) -> None:
    cluster.add_node("tainted", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
    cluster.add_node("cordoned", unschedulable=True)
    cluster.add_node("labelled", labels={"zone": "z1"})
    cluster.add_node("small", cpu="1")
    p = cluster.add_pod("p", {GPU: "1", "cpu": "2"}, nodeSelector={"zone": "z1"})
    t = cluster.add_pod(
        "t",
        {GPU: "1"},
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}
                    ]
                }
            }
        },
    )
    big = cluster.add_pod("big", {"cpu": "200"})
    cluster.schedule()
    assert cluster.node_of(p) == "labelled"
    assert cluster.node_of(t) in ("tainted", "small")
    assert cluster.events(big, "FailedScheduling") == [
        "0/4 nodes are available: 1 node(s) had untolerated taint {dedicated: x}, "
        "1 node(s) were unschedulable, 2 Insufficient cpu. preemption: 0/4 nodes are "
        "available: 2 No preemption victims found for incoming pod, 2 Preemption is not "
        "helpful for scheduling."
    ]


def test_init_container_rule(cluster: FakeCluster) -> None:
    cluster.add_node("a", gpus=0, cpu="4")
    ok = cluster.add_pod("ok", {"cpu": "2"}, init=[{"cpu": "4"}])  # max(2, 4) = 4 fits
    cluster.schedule()
    assert cluster.node_of(ok) == "a"
    full = cluster.add_pod("full", {"cpu": "1"})
    cluster.schedule()
    assert cluster.node_of(full) == ""  # the pod is accounted max(sum(app)=2, init=4) = 4


def test_bad_inputs_stay_pending_with_a_reason(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    big_slice = cluster.add_pod("big-slice", {CORE: "150", MEM: "10"})
    mixed = cluster.add_pod("mixed", {GPU: "1", CORE: "10", MEM: "10"})
    impossible = cluster.add_pod("impossible", {GPU: "9"})
    override = cluster.add_pod("override", {GPU: "1"}, annotations={POLICY: "tightest"})
    bad_qty = cluster.add_pod("qty", {"cpu": "lots"})
    cluster.schedule()
    expected = {
        big_slice: "a slice is at most 100",
        mixed: "mixes whole devices",
        impossible: "pod asks for 9 alibabacloud.com/gpu in all but the largest node has 8",
        override: "annotation lingjun.com/gpu-policy='tightest' is not one of binpack, spread",
        bad_qty: "invalid quantity 'lots'",
    }
    for uid, text in expected.items():
        assert cluster.node_of(uid) == ""
        (msg,) = cluster.events(uid, "FailedScheduling")
        assert text in msg, msg
    ok = cluster.add_pod("ok", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(ok) == "a"  # the scheduler keeps going


def test_failed_scheduling_aggregates_reasons(cluster: FakeCluster) -> None:
    for i in range(6):
        cluster.add_node(f"n{i}", gpus=1)
    for i in range(4):
        cluster.add_node(f"t{i}", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    fill = [cluster.add_pod(f"f{i}", {GPU: "1"}) for i in range(6)]
    cluster.schedule()
    assert all(cluster.node_of(u).startswith("n") for u in fill)
    p = cluster.add_pod("p", {GPU: "1"})
    cluster.schedule()
    assert cluster.events(p, "FailedScheduling") == [
        "0/10 nodes are available: 4 node(s) had untolerated taint {k: v}, "
        "6 Insufficient alibabacloud.com/gpu. preemption: 0/10 nodes are available: 4 "
        "Preemption is not helpful for scheduling, 6 No preemption victims found for incoming "
        "pod."
    ]


def test_nodes_sharing_an_untolerated_taint_are_ruled_out_as_a_group(
    make_cluster: MakeCluster, mocker: MockerFixture
) -> None:
    cluster = make_cluster(NO_BACKOFF)
    unreachable = "node.kubernetes.io/unreachable"
    for i in range(20):  # empty and first by name: first in the free-device index
        cluster.add_node(f"a{i:02}", taints=[{"key": unreachable, "effect": "NoSchedule"}])
    cluster.add_node("z", gpus=1)
    judged = mocker.spy(TaintToleration, "filter")
    p = cluster.add_pod("p", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(p) == "z"
    assert [c.args[3].name for c in judged.call_args_list] == ["z"]  # no tainted node filtered
    q = cluster.add_pod("q", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(q) == ""
    assert cluster.events(q, "FailedScheduling") == [
        "0/21 nodes are available: 1 Insufficient alibabacloud.com/gpu, "
        f"20 node(s) had untolerated taint {{{unreachable}}}. preemption: 0/21 nodes are "
        "available: 1 No preemption victims found for incoming pod, 20 Preemption is not "
        "helpful for scheduling."
    ]
    tolerant = cluster.add_pod(
        "t", {GPU: "1"}, tolerations=[{"key": unreachable, "operator": "Exists"}]
    )
    cluster.schedule()
    assert cluster.node_of(tolerant).startswith("a")
    healed = cluster.nodes["a05"]
    healed["spec"]["taints"] = []
    cluster.scheduler.on_node("MODIFIED", copy.deepcopy(healed))

    def placed_on_healed_node() -> bool:  # q comes back after its (1 ms) backoff
        cluster.schedule()
        return cluster.node_of(q) == "a05"  # the node left its group when its taint went

    wait_for(placed_on_healed_node, 5, "q placed on the node whose taint was lifted")


def test_missing_runtime_class_warns_once(cluster: FakeCluster) -> None:
    cluster.add_node("a")
    p = cluster.add_pod("p", {GPU: "1"}, runtime_class=None)
    cluster.schedule()
    assert cluster.node_of(p) == "a"
    (msg,) = cluster.events(p, "MissingRuntimeClass")
    assert "not lj-runtime: its devices would not be injected" in msg
    q = cluster.add_pod("q", {"cpu": "1"}, runtime_class=None)
    cluster.schedule()
    assert cluster.events(q, "MissingRuntimeClass") == []


def test_failed_bind_forgets_the_assumption_and_requeues(cluster: FakeCluster) -> None:
    cluster.add_node("a", gpus=1)
    cluster.fail_binds = 1
    p = cluster.add_pod("p", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(p) == ""
    assert cluster.scheduler.cache.pods == {}
    assert cluster.scheduler.cache.free_whole("gpu", "a") == 1
    assert "Binding rejected: injected bind failure" in cluster.events(p, "FailedScheduling")
    assert cluster.scheduler.queue.counts()["backoff"] == 1


def test_unschedulable_pod_retried_when_a_pod_leaves(cluster: FakeCluster) -> None:
    cluster.add_node("a", gpus=1)
    first = cluster.add_pod("first", {GPU: "1"})
    cluster.schedule()
    waiting = cluster.add_pod("waiting", {GPU: "1"})
    cluster.schedule()
    assert cluster.scheduler.queue.counts()["unschedulable"] == 1
    cluster.delete_pod(first)
    counts = cluster.scheduler.queue.counts()
    assert counts["unschedulable"] == 0
    assert counts["backoff"] + counts["active"] == 1
    cluster.scheduler.queue._backoff[:] = [
        (0.0, s, u) for (_, s, u) in cluster.scheduler.queue._backoff
    ]
    cluster.schedule()
    assert cluster.node_of(waiting) == "a"


def test_restart_rebuilds_device_accounting(cluster: FakeCluster) -> None:
    cluster.add_node("a", inventory=nvlink_inventory("a"))
    uids = [cluster.add_pod(f"p{i}", {GPU: "3"}) for i in range(2)]
    cluster.schedule()
    before = {u: cluster.assignment(u) for u in uids}
    cluster.restart()
    assert cluster.scheduler.cache.free_whole("gpu", "a") == 2
    more = [cluster.add_pod(f"q{i}", {GPU: "1"}) for i in range(3)]
    cluster.schedule()
    assert sum(1 for u in more if cluster.node_of(u)) == 2
    assert {u: cluster.assignment(u) for u in uids} == before
    assert cluster.scheduler.cache.violations() == []


def test_single_devices_fill_broken_islands_first(cluster: FakeCluster) -> None:
    mig_res = PROTOCOL.resources.mig("3g.40gb")
    inv = nvlink_inventory("a", mig={7: ["3g.40gb", "4g.40gb"]})
    cluster.add_node("a", inventory=inv, extra={mig_res: "1"})
    p = cluster.add_pod("one", {GPU: "1"})
    cluster.schedule()
    # gpu7 is in MIG mode: island 4-7 is already broken, so the single GPU comes from it
    assert decode_assignment(cluster.assignment(p))["c0"][0].device_id == "a-gpu4"
    q = cluster.add_pod("four", {GPU: "4"})
    cluster.schedule()
    assert sorted(d.device_id for d in decode_assignment(cluster.assignment(q))["c0"]) == [
        f"a-gpu{i}" for i in range(4)
    ]


def test_preferred_node_affinity_outweighs_binpack(cluster: FakeCluster) -> None:
    cluster.add_node("a", labels={"zone": "z1"})
    cluster.add_node("b", labels={"zone": "z2", "fast": "true"})
    first = cluster.add_pod("first", {GPU: "1"})
    cluster.schedule()
    packed = cluster.node_of(first)
    other = "b" if packed == "a" else "a"
    plain = cluster.add_pod("plain", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(plain) == packed  # binpack alone
    zone = "z2" if other == "b" else "z1"
    prefer_other = preferred_affinity((50, "zone", zone))
    wants_other = cluster.add_pod("prefers", {GPU: "1"}, affinity=prefer_other)
    cluster.schedule()
    assert cluster.node_of(wants_other) == other
    # The weights add up: 80 for fast=true (b) beats 10 for zone z1 (a).
    both = cluster.add_pod(
        "weighed", {GPU: "1"}, affinity=preferred_affinity((10, "zone", "z1"), (80, "fast", "true"))
    )
    cluster.schedule()
    assert cluster.node_of(both) == "b"
    # A preference no node matches rules nothing out.
    prefer_none = preferred_affinity((100, "zone", "z9"))
    nowhere = cluster.add_pod("nowhere", {GPU: "1"}, affinity=prefer_none)
    cluster.schedule()
    assert cluster.node_of(nowhere) in ("a", "b")


def test_prefer_no_schedule_taint_is_avoided_unless_tolerated(cluster: FakeCluster) -> None:
    soft = [{"key": "dedicated", "value": "infra", "effect": "PreferNoSchedule"}]
    tolerate = [{"key": "dedicated", "operator": "Equal", "value": "infra"}]
    cluster.add_node("a", labels={"pool": "infra"}, taints=soft)
    cluster.add_node("b")
    for i in range(3):  # fill part of the tainted node: binpack now pulls towards it
        cluster.add_pod(
            f"infra{i}", {GPU: "1"}, tolerations=tolerate, nodeSelector={"pool": "infra"}
        )
    cluster.schedule()
    plain = cluster.add_pod("plain", {GPU: "1"})
    cluster.schedule()
    assert cluster.node_of(plain) == "b"
    tolerant = cluster.add_pod("tolerant", {GPU: "1"}, tolerations=tolerate)
    cluster.schedule()
    assert cluster.node_of(tolerant) == "a"  # the taint counts for nothing: binpack decides


def test_extender_prioritize_scores_devices_not_what_kube_scheduler_scores(
    cluster: FakeCluster,
) -> None:
    cluster.add_node("a", labels={"zone": "z1"})
    cluster.add_node("b", labels={"zone": "z2"})
    first = cluster.add_pod("first", {GPU: "1"}, nodeSelector={"zone": "z1"})
    cluster.schedule()
    assert cluster.node_of(first) == "a"
    extender = Extender(cluster.scheduler)
    body = {
        "Pod": {
            "metadata": {"name": "p", "namespace": "default", "uid": "u-p"},
            "spec": {
                "schedulerName": "lj-scheduler",
                "affinity": preferred_affinity((100, "zone", "z2")),
                "containers": [{"name": "c0", "resources": {"limits": {GPU: "1"}}}],
            },
        },
        "NodeNames": ["a", "b"],
    }
    scores = {h["Host"]: h["Score"] for h in extender.prioritize(body)}
    # binpack (GpuShare) favours the fuller node a; the preference for z2 is the
    # kube-scheduler's to score, so it does not turn the extender's answer round.
    assert scores["a"] > scores["b"]


def test_init_containers_are_placed_on_the_pods_own_devices(cluster: FakeCluster) -> None:
    """The kubelet hands an init container's devices to the app containers again: the init
    container gets the pod's devices, and the node accounts the pod once."""
    cluster.add_node("a", inventory=nvlink_inventory("a"))
    whole = cluster.add_pod("whole", [{GPU: "1"}, {GPU: "1"}], init=[{GPU: "2"}])
    sliced = cluster.add_pod("sliced", {CORE: "50", MEM: "20"}, init=[{CORE: "30", MEM: "40"}])
    cluster.schedule()
    got = decode_assignment(cluster.assignment(whole))
    apps = {s.device_id for c in ("c0", "c1") for s in got[c]}
    assert len(apps) == 2
    assert {s.device_id for s in got["init0"]} == apps
    cut = decode_assignment(cluster.assignment(sliced))
    (init_share,) = cut["init0"]
    (app_share,) = cut["c0"]
    assert init_share.device_id == app_share.device_id
    node = cluster.scheduler.cache.nodes["a"]
    dev = node.devices.by_id[app_share.device_id]
    assert (dev.core_used, dev.memory_used) == (50, 40)  # max(init, app) per resource
    assert node.devices.free_whole_count("gpu") == 8 - 3
    assert cluster.scheduler.cache.violations() == []
