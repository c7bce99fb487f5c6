"""Gang scheduling on the in-memory framework: all or nothing, topology, deadlock, bad groups."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import pytest
from pytest_mock import MockerFixture

from lj_runtimekit.proto.pkg.protocol import decode_assignment
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo, parse_pod
from lj_runtimekit.schedulerframework.internal.framework.types import CycleState, Status
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling import plugin as cos
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling.gang import (
    EXCLUSIVE_TOPOLOGY,
    JOB_KEY,
    JOBSET_NAME,
)
from lj_runtimekit.schedulerframework.internal.plugins.tainttoleration import TaintToleration
from lj_runtimekit.testkit.scheduler.fake import CORE, GPU, MEM, PROTOCOL, FakeCluster
from lj_runtimekit.testkit.waits import wait_for

A = PROTOCOL.annotations
L = PROTOCOL.labels


MADE: list[FakeCluster] = []


@pytest.fixture(autouse=True)
def _stop_clusters() -> Iterator[None]:
    yield
    while MADE:
        MADE.pop().scheduler.stop()  # waiting pods and their timers go with it


def topo_cluster(
    blocks: int = 2, switches: int = 2, nodes: int = 4, runtime: str = "v1.15.0"
) -> FakeCluster:
    c = FakeCluster()
    MADE.append(c)
    for b in range(blocks):
        for s in range(switches):
            for n in range(nodes):
                c.add_node(
                    f"b{b}s{s}n{n}",
                    labels={
                        L.topology_block: f"b{b}",
                        L.topology_switch: f"s{s}",
                        L.runtime_version: runtime,
                    },
                )
    return c


def gang(c: FakeCluster, name: str, size: int, **ann: str) -> list[str]:
    annotations = {A.gang_group: name, A.gang_min_members: str(size), **ann}
    return [c.add_pod(f"{name}-{i}", {GPU: "8"}, annotations=annotations) for i in range(size)]


def jobset(
    c: FakeCluster, name: str, jobs: int, per_job: int, extra: Mapping[str, str] | None = None
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for j in range(jobs):
        key = f"{name}-job{j}"
        out[key] = [
            c.add_pod(
                f"{key}-{i}",
                {GPU: "8"},
                annotations={A.gang_min_members: str(jobs * per_job), **(extra or {})},
                labels={JOBSET_NAME: name, JOB_KEY: key},
            )
            for i in range(per_job)
        ]
    return out


def nodes_of(c: FakeCluster, uids: list[str]) -> list[str]:
    return [c.node_of(u) for u in uids]


def flush(c: FakeCluster) -> None:
    """Lets every backed-off or unschedulable pod try again now, and schedules."""
    q = c.scheduler.queue
    q.move_all_to_active_or_backoff()
    with q._cond:
        q._backoff[:] = [(0.0, s, u) for (_, s, u) in q._backoff]
    c.schedule()


def test_gang_placed_whole_in_the_smallest_domain() -> None:
    c = topo_cluster()
    small = gang(c, "small", 3)
    c.schedule()
    assert all(nodes_of(c, small))
    assert len({n[:4] for n in nodes_of(c, small)}) == 1  # one switch
    big = gang(c, "big", 6)
    c.schedule()
    placed = nodes_of(c, big)
    assert all(placed)
    assert len({n[:2] for n in placed}) == 1
    events = c.events(big[0], "GangWaiting")
    assert events[0].startswith("1/6 members reserved, waiting up to 60s")


def test_a_gang_plan_skips_nodes_with_an_untolerated_taint_unfiltered(
    mocker: MockerFixture,
) -> None:
    c = FakeCluster()
    MADE.append(c)
    for i in range(6):
        taints = [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]
        c.add_node(f"a{i}", taints=taints)  # first by name, none usable
    for i in range(2):
        c.add_node(f"z{i}")
    judged = mocker.spy(TaintToleration, "filter")
    members = gang(c, "g", 2)
    c.schedule()
    assert sorted(nodes_of(c, members)) == ["z0", "z1"]
    assert {call.args[3].name for call in judged.call_args_list} <= {"z0", "z1"}


def test_jobset_jobs_each_on_one_switch() -> None:
    c = topo_cluster()
    js = jobset(c, "train", jobs=2, per_job=4)
    c.schedule()
    for uids in js.values():
        assert len({n[:4] for n in nodes_of(c, uids)}) == 1, nodes_of(c, uids)
    assert len({n[:2] for uids in js.values() for n in nodes_of(c, uids)}) == 1


def test_too_big_for_a_block_preferred_spans_fewest_required_stays_pending() -> None:
    c = topo_cluster(blocks=3)
    req = gang(c, "req", 10, **{A.gang_topology: "required"})
    c.schedule()
    assert not any(nodes_of(c, req))
    assert any(
        "topology required: no single block holds the 10 member(s)" in e
        for e in c.events(req[0], "FailedScheduling")
    )
    assert c.scheduler.cache.pods == {}  # nothing reserved either
    for u in req:
        c.delete_pod(u)
    pref = gang(c, "pref", 10)
    c.schedule()
    assert all(nodes_of(c, pref))
    assert len({n[:2] for n in nodes_of(c, pref)}) == 2  # the fewest blocks


def test_timeout_releases_every_member_and_devices() -> None:
    c = FakeCluster(
        {"profiles": [{"pluginConfig": [{"name": "Coscheduling", "args": {"backoffSeconds": 30}}]}]}
    )
    MADE.append(c)
    for i in range(3):
        c.add_node(f"n{i}")
    ann = {A.gang_group: "t", A.gang_min_members: "3", A.gang_timeout_seconds: "0.5"}
    uids = [c.add_pod(f"t{i}", {GPU: "8"}, annotations=ann) for i in range(2)]
    # the third member can never pass Filter on the planned nodes
    uids.append(c.add_pod("t2", {GPU: "8"}, annotations=ann, nodeSelector={"nowhere": "x"}))
    c.schedule()
    assert not any(nodes_of(c, uids))
    assert len(c.scheduler.cache.pods) == 2  # two reserved with their devices, waiting
    assert cos.WAITING_GANGS._value.get() == 1
    wait_for(lambda: not c.scheduler.cache.pods, 10, "the cache emptied", interval_s=0.02)
    c.scheduler.wait_binds()
    assert not any(nodes_of(c, uids))
    assert cos.WAITING_GANGS._value.get() == 0
    assert all(c.scheduler.cache.nodes[f"n{i}"].devices.free_whole("gpu") for i in range(3))
    flush(c)
    msgs = " ".join(c.events(uids[0]) + c.events(uids[1]))
    assert "released every reserved member" in msgs or "timeout" in msgs
    assert any("backing off" in e for u in uids[:2] for e in c.events(u, "FailedScheduling"))


def test_a_plan_not_met_by_its_timeout_is_not_made_again_unchanged() -> None:
    c = FakeCluster(
        {
            "profiles": [
                {"pluginConfig": [{"name": "Coscheduling", "args": {"backoffSeconds": 0.1}}]}
            ]
        }
    )
    MADE.append(c)
    for i in range(3):
        c.add_node(f"n{i}")
    ann = {A.gang_group: "u", A.gang_min_members: "3", A.gang_timeout_seconds: "0.3"}
    uids = [c.add_pod(f"u{i}", {GPU: "8"}, annotations=ann) for i in range(2)]
    # the third member never passes Filter on the planned nodes
    stuck = c.add_pod("u2", {GPU: "8"}, annotations=ann, nodeSelector={"nowhere": "x"})
    c.schedule()
    assert len(c.scheduler.cache.pods) == 2  # two reserved, waiting
    wait_for(lambda: not c.scheduler.cache.pods, 10, "the gang released", interval_s=0.02)
    coscheduling = c.scheduler.frameworks["lj-scheduler"].plugin("Coscheduling")
    assert isinstance(coscheduling, cos.Coscheduling)
    time.sleep(0.2)  # the gang's backoff is over
    flush(c)
    assert not c.scheduler.cache.pods  # nothing reserved again ...
    assert coscheduling.claims() == {}  # ... and no node held for the same plan
    assert any(
        "would be planned again unchanged" in e for e in c.events(uids[0], "FailedScheduling")
    ), c.events(uids[0])
    # the member that did not fit is replaced: the gang is planned and placed
    c.delete_pod(stuck)
    uids.append(c.add_pod("u2b", {GPU: "8"}, annotations=ann))
    flush(c)
    assert all(nodes_of(c, uids))


def test_a_permit_timeout_in_the_gap_before_the_gangs_allow_binds_nothing_partial() -> None:
    c = topo_cluster(blocks=1, switches=1, nodes=2)
    uids = gang(c, "gap", 2)
    coscheduling = c.scheduler.frameworks["lj-scheduler"].plugin("Coscheduling")
    assert isinstance(coscheduling, cos.Coscheduling)
    permit = coscheduling.permit

    def permit_then_timer(state: CycleState, pod: PodInfo, node_name: str) -> tuple[Status, float]:
        out = permit(state, pod, node_name)
        if pod.uid == uids[1]:  # the gang is complete; the first member's timer fires now
            first = c.scheduler.get_waiting_pod(uids[0])
            if first is not None:
                first.reject(cos.NAME, "rejected due to timeout at Permit")
        return out

    coscheduling.permit = permit_then_timer  # type: ignore[method-assign]
    c.schedule()
    placed = nodes_of(c, uids)
    assert all(placed) or not any(placed), placed
    assert all(placed)  # the gang was complete before the timer: its allow stands


def test_four_competing_gangs_three_fit_no_deadlock() -> None:
    c = topo_cluster(blocks=1, switches=3, nodes=4)  # 12 nodes, room for three 4-pod gangs
    gangs: dict[str, list[str]] = {f"g{k}": [] for k in range(4)}
    ann = {k: {A.gang_group: k, A.gang_min_members: "4"} for k in gangs}
    for i in range(4):  # members arrive interleaved
        for k in gangs:
            gangs[k].append(c.add_pod(f"{k}-{i}", {GPU: "8"}, annotations=ann[k]))
    c.schedule()
    flush(c)
    whole = [k for k, uids in gangs.items() if all(nodes_of(c, uids))]
    none = [k for k, uids in gangs.items() if not any(nodes_of(c, uids))]
    placement = {k: nodes_of(c, u) for k, u in gangs.items()}
    assert len(whole) == 3, placement
    assert len(none) == 1, placement
    for u in gangs[none[0]]:
        assert any("no room for the 4 still to place" in e for e in c.events(u))
    assert not [p for p in c.scheduler.cache.pods.values() if p.assumed]
    # the placed gangs finish: the fourth goes whole
    for u in gangs[whole[0]]:
        c.delete_pod(u)
    flush(c)
    assert all(nodes_of(c, gangs[none[0]]))


def test_a_pod_turned_away_by_a_gang_claim_is_tried_again_once_the_claim_goes() -> None:
    c = FakeCluster({"podInitialBackoffSeconds": 0.001, "podMaxBackoffSeconds": 0.001})
    MADE.append(c)
    c.add_node("n0", labels={"pin": "yes"})
    c.add_node("n1")
    ann = {A.gang_group: "g", A.gang_min_members: "2"}
    members = [c.add_pod("g-0", {GPU: "2"}, annotations=ann)]
    # tried between the gang's two members, while the gang's plan holds n0: 6 GPUs free,
    # 2 of them held for the member to come
    pinned = c.add_pod("pinned", {GPU: "5"}, nodeSelector={"pin": "yes"})
    members.append(c.add_pod("g-1", {GPU: "2"}, annotations=ann))
    c.schedule(max_cycles=2)
    assert any("held for a gang being placed" in e for e in c.events(pinned, "FailedScheduling"))
    c.delete_pod(members[0])  # the waiting member goes: the gang's plan and claim go
    assert c.scheduler.queue.counts()["unschedulable"] == 0  # moved at once
    time.sleep(0.01)
    c.schedule()
    assert c.node_of(pinned) == "n0"


def test_a_gang_claim_holds_only_the_room_the_gang_still_needs() -> None:
    c = FakeCluster()
    MADE.append(c)
    c.add_node("n0")
    ann = {A.gang_group: "g", A.gang_min_members: "2"}
    members = [c.add_pod(f"g-{i}", {GPU: "2"}, annotations=ann, priority=100) for i in (0, 1)]
    c.schedule(max_cycles=1)  # g-0 reserved and waiting: 6 GPUs free, 2 held for g-1
    assert c.scheduler.cache.is_assumed(members[0])
    fits = parse_pod(c.pods[c.add_pod("fits", {GPU: "4"}, priority=100)])
    too_big = parse_pod(c.pods[c.add_pod("too-big", {GPU: "5"}, priority=100)])
    assert [n.name for n in c.scheduler.filter_nodes(fits, "")] == ["n0"]
    assert c.scheduler.filter_nodes(too_big, "") == []
    coscheduling = c.scheduler.frameworks["lj-scheduler"].plugin("Coscheduling")
    assert isinstance(coscheduling, cos.Coscheduling)
    node = c.scheduler.cache.nodes["n0"]
    status = coscheduling.filter(CycleState(), too_big, node)
    assert status.message() == "node(s) held for a gang being placed"
    assert coscheduling.filter(CycleState(), fits, node).ok
    c.schedule()
    assert nodes_of(c, members) == ["n0", "n0"]
    assert c.node_of(fits.uid) == "n0"
    assert not c.scheduler.evictor.done


def test_a_gang_claim_never_holds_room_against_a_higher_priority_pod() -> None:
    c = FakeCluster()
    MADE.append(c)
    c.add_node("n0")
    ann = {A.gang_group: "g", A.gang_min_members: "2"}
    g0 = c.add_pod("g-0", {GPU: "4"}, annotations=ann, priority=100)
    c.add_pod("g-1", {GPU: "4"}, annotations=ann, priority=100)
    c.schedule(max_cycles=1)  # g-0 reserved and waiting; the plan holds 4 GPUs for g-1
    assert c.scheduler.cache.is_assumed(g0)
    high = c.add_pod("high", {GPU: "4"}, priority=200)
    c.schedule(max_cycles=1)
    assert c.node_of(high) == "n0"
    assert not c.scheduler.evictor.done  # nothing preempted, the gang's member untouched
    assert c.scheduler.cache.is_assumed(g0)


def test_a_gang_of_slices_is_planned_from_what_fits_on_the_devices() -> None:
    """Two 60 % slices never share a GPU: 8 such members fit on an 8-GPU node, not the 13
    that its 800 % of core would suggest."""
    c = topo_cluster(blocks=1, switches=1, nodes=2)
    ann = {A.gang_group: "s", A.gang_min_members: "16"}
    uids = [c.add_pod(f"s-{i}", {CORE: "60", MEM: "10"}, annotations=ann) for i in range(16)]
    c.schedule()
    assert sorted(nodes_of(c, uids)) == ["b0s0n0"] * 8 + ["b0s0n1"] * 8
    assert not any("outside gang" in e for u in uids for e in c.events(u))
    devices = {(c.node_of(u), decode_assignment(c.assignment(u))["c0"][0].device_id) for u in uids}
    assert len(devices) == 16
    # one more than fits: no plan, nothing reserved, nothing claimed
    ann = {A.gang_group: "t", A.gang_min_members: "17"}
    c.add_node("b0s0n2", labels={L.topology_block: "b0", L.topology_switch: "s0"})
    c.add_node("b0s0n3", labels={L.topology_block: "b0", L.topology_switch: "s0"}, gpus=1)
    more = [c.add_pod(f"t-{i}", {CORE: "60", MEM: "10"}, annotations=ann) for i in range(17)]
    c.schedule()
    assert not any(nodes_of(c, more))
    assert any("no room for the 17 still to place" in e for e in c.events(more[0]))
    assert not [p for p in c.scheduler.cache.pods.values() if p.assumed]
    coscheduling = c.scheduler.frameworks["lj-scheduler"].plugin("Coscheduling")
    assert isinstance(coscheduling, cos.Coscheduling)
    assert coscheduling.claims() == {}


def test_exclusive_topology_gives_each_job_a_whole_block() -> None:
    c = topo_cluster(blocks=3, switches=1, nodes=4)
    js = jobset(c, "ex", jobs=2, per_job=2, extra={EXCLUSIVE_TOPOLOGY: L.topology_block})
    c.schedule()
    blocks = {k: {n[:2] for n in nodes_of(c, u)} for k, u in js.items()}
    assert all(len(b) == 1 for b in blocks.values())
    assert len(set[str]().union(*blocks.values())) == 2
    other = jobset(c, "other", jobs=1, per_job=2)
    c.schedule()
    (uids,) = other.values()
    assert {n[:2] for n in nodes_of(c, uids)}.isdisjoint(set[str]().union(*blocks.values()))


def test_restarted_member_rejoins_its_running_gang() -> None:
    c = topo_cluster()
    uids = gang(c, "r", 4)
    c.schedule()
    before = nodes_of(c, uids)
    for u in uids:  # running
        c.pods[u]["status"]["phase"] = "Running"
    c.delete_pod(uids[0])
    gang(c, "other", 3)  # competition for the freed node
    c.schedule()
    new = c.add_pod("r-0b", {GPU: "8"}, annotations={A.gang_group: "r", A.gang_min_members: "4"})
    flush(c)
    assert c.node_of(new)[:4] == before[1][:4]  # back in the gang's switch
    assert not c.events(new, "GangWaiting")  # completes the gang: no wait


def test_restart_while_waiting_binds_nothing_partial() -> None:
    c = topo_cluster()
    uids = gang(c, "w", 4)
    for _ in range(2):  # two members reserved and waiting at Permit
        qp = c.scheduler.queue.pop(timeout_s=0)
        assert qp is not None
        c.scheduler.schedule_one(qp)
    assert len(c.scheduler.cache.pods) == 2
    c.restart()
    assert not any(nodes_of(c, uids))
    c.schedule()
    assert all(nodes_of(c, uids))


def test_feature_gate_off_schedules_without_topology_and_says_so() -> None:
    c = topo_cluster(blocks=3, runtime="v1.14.0")
    uids = gang(c, "old", 10, **{A.gang_topology: "required"})
    c.schedule()
    assert all(nodes_of(c, uids))
    (planner,) = [u for u in uids if c.events(u, "GangPlanned")]
    (note,) = c.events(planner, "GangTopologyOff")  # once, with the plan
    assert "runs Runtime v1.14.0; feature topology-gang needs" in note
    assert not any(c.events(u, "GangTopologyOff") for u in uids if u != planner)


@pytest.mark.parametrize(
    ("annotations", "labels", "text"),
    [
        ({A.gang_group: "x"}, {}, "has no minimum: set annotation"),
        ({A.gang_group: "x", A.gang_min_members: "two"}, {}, "must be an integer >= 1"),
        ({A.gang_group: "x", A.gang_min_members: "0"}, {}, "must be an integer >= 1"),
        ({A.gang_min_members: "2"}, {}, "names no gang"),
        (
            {A.gang_group: "x", A.gang_min_members: "2", A.gang_timeout_seconds: "-1"},
            {},
            "must be a number of seconds > 0",
        ),
        (
            {A.gang_group: "x", A.gang_min_members: "2", A.gang_topology: "rack"},
            {},
            "must be one of required, preferred",
        ),
        ({A.gang_group: "x", A.gang_min_members: "100000"}, {}, "the whole cluster could hold"),
        ({}, {JOBSET_NAME: "js"}, "the size of JobSet default/js is unknown"),
        (
            {A.gang_group: "x", A.gang_min_members: "1", EXCLUSIVE_TOPOLOGY: "k"},
            {},
            "applies to JobSet pods only",
        ),
    ],
)
def test_bad_group_definitions_stay_pending_with_the_reason(
    annotations: dict[str, str], labels: dict[str, str], text: str
) -> None:
    c = topo_cluster(blocks=1, switches=1, nodes=2)
    uid = c.add_pod("bad", {GPU: "8"}, annotations=annotations, labels=labels)
    c.schedule()
    assert not c.node_of(uid)
    assert any(text in e for e in c.events(uid, "FailedScheduling")), c.events(uid)


def test_jobset_size_from_the_jobset_object() -> None:
    c = topo_cluster(blocks=1, switches=1, nodes=4)
    obj = {
        "spec": {
            "replicatedJobs": [
                {"name": "w", "replicas": 2, "template": {"spec": {"parallelism": 2}}},
            ]
        }
    }
    c.scheduler.get_json = lambda path: obj if path.endswith("/jobsets/js") else None  # type: ignore[method-assign]
    uids = [
        c.add_pod(f"js-{i}", {GPU: "8"}, labels={JOBSET_NAME: "js", JOB_KEY: f"js-w-{i // 2}"})
        for i in range(3)
    ]
    c.schedule()
    assert not any(nodes_of(c, uids))
    assert any("3/4 members created" in e for e in c.events(uids[0], "FailedScheduling"))
    uids.append(c.add_pod("js-3", {GPU: "8"}, labels={JOBSET_NAME: "js", JOB_KEY: "js-w-1"}))
    c.schedule()
    assert all(nodes_of(c, uids))
    bad = c.add_pod(
        "js2", {GPU: "8"}, annotations={A.gang_min_members: "9"}, labels={JOBSET_NAME: "js"}
    )
    c.schedule()
    assert any("larger than JobSet default/js can ever be (4 pods" in e for e in c.events(bad))


def test_config_args_validated() -> None:
    from lj_runtimekit.schedulerframework.internal.config.config import ConfigError, parse_config

    cfg = {"profiles": [{"pluginConfig": [{"name": "Coscheduling", "args": {"requireJobSet": 1}}]}]}
    with pytest.raises(ConfigError, match=r"args\.requireJobSet must be true or false"):
        parse_config(cfg, "<t>")
    cfg = {
        "profiles": [
            {"pluginConfig": [{"name": "Coscheduling", "args": {"defaultTimeoutSeconds": 0}}]}
        ]
    }
    with pytest.raises(ConfigError, match="defaultTimeoutSeconds must be a number of seconds"):
        parse_config(cfg, "<t>")


def test_queue_activate_moves_unschedulable_and_in_flight_pods() -> None:
    from lj_runtimekit.schedulerframework.internal.queue.queue import SchedulingQueue

    c = FakeCluster()
    MADE.append(c)
    q = SchedulingQueue(initial_backoff_s=30, max_backoff_s=30)
    a = c.add_pod("a", {GPU: "1"})
    b = c.add_pod("b", {GPU: "1"})
    pods = {u: c.scheduler.queue._pods[u].pod for u in (a, b)}
    for pod in pods.values():
        q.add(pod)
    qa, qb = q.pop(timeout_s=0), q.pop(timeout_s=0)
    assert qa is not None
    assert qb is not None
    q.add_unschedulable(qa)
    q.activate([a, b])  # a: unschedulable -> active; b: in flight -> active when handed back
    q.add_unschedulable(qb)
    assert q.counts()["active"] == 2


def test_a_profile_requiring_jobsets_needs_the_jobset_api() -> None:
    from lj_runtimekit.proto.pkg.kube import KubeError
    from lj_runtimekit.schedulerframework.internal.config.config import parse_config

    plain = parse_config({}, "<t>")
    strict = parse_config(
        {
            "profiles": [
                {"pluginConfig": [{"name": "Coscheduling", "args": {"requireJobSet": True}}]}
            ]
        },
        "<t>",
    )
    asked: list[str] = []

    def absent(path: str) -> None:
        asked.append(path)

    def broken(path: str) -> None:
        raise KubeError(f"GET {path}", 0, "connection refused")

    assert cos.job_set_problem(plain, absent) is None
    assert asked == []  # not even asked
    assert cos.job_set_problem(strict, lambda path: {"kind": "APIResourceList"}) is None
    problem = cos.job_set_problem(strict, absent)
    assert problem is not None
    assert "requireJobSet is true but the JobSet API" in problem
    assert asked == [cos.JOBSET_API]
    assert "cannot check for the JobSet API: GET /apis/jobset" in str(
        cos.job_set_problem(strict, broken)
    )
