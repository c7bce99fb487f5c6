"""Preemption on the in-memory API server double: nominated pods, victims still going, PDBs."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.schedulerframework.internal.cache.podinfo import parse_pod
from lj_runtimekit.schedulerframework.internal.plugins.defaultpreemption import (
    Unit,
    parse_budgets,
    split_by_budgets,
)
from lj_runtimekit.testkit.scheduler.fake import FakeCluster

P = load_protocol()
GPU = P.resources.gpu
A = P.annotations
L = P.labels
NOT_ELIGIBLE = "preemption: not eligible due to a terminating pod on the nominated node."


def fill_node(cluster: FakeCluster, pods: int, gpus: int) -> list[str]:
    uids = [cluster.add_pod(f"low-{i}", {GPU: str(gpus)}, priority=0) for i in range(pods)]
    cluster.schedule()
    assert all(cluster.node_of(u) == "n0" for u in uids)
    return uids


def test_freed_devices_are_kept_for_the_nominated_pod(cluster: FakeCluster) -> None:
    cluster.add_node("n0", gpus=8)
    low = fill_node(cluster, 8, 1)
    before = REGISTRY.get_sample_value("lj_scheduler_preemptions_total") or 0.0
    high = cluster.add_pod("high", {GPU: "2"}, priority=100)
    cluster.schedule()
    (done,) = cluster.scheduler.evictor.done
    assert REGISTRY.get_sample_value("lj_scheduler_preemptions_total") == before + 1
    assert done.node == "n0"
    assert len(done.victims) == 2
    assert cluster.node_of(high) == ""
    assert any("Preempting 2 lower-priority pod(s) on node n0" in e for e in cluster.events(high))
    # retried while its victims are still there: no second preemption
    cluster.scheduler.queue.activate([high])
    cluster.schedule()
    assert len(cluster.scheduler.evictor.done) == 1
    assert any(e.endswith(NOT_ELIGIBLE) for e in cluster.events(high))
    # a lower-priority pod arrives; the victims go; what they freed is not for it
    late = cluster.add_pod("late", {GPU: "1"}, priority=0)
    for v in done.victims:
        cluster.delete_pod(v.uid)
    assert cluster.scheduler.filter_nodes(parse_pod(cluster.pods[late]), "") == []
    # the last victim gone, the pod is tried at once (not after its backoff)
    assert cluster.scheduler.queue.counts()["backoff"] == 0
    cluster.schedule()
    assert cluster.node_of(high) == "n0"
    assert cluster.node_of(late) == ""
    assert len([u for u in low if u in cluster.pods]) == 6


def test_equal_priority_does_not_preempt(cluster: FakeCluster) -> None:
    cluster.add_node("n0", gpus=8)
    fill_node(cluster, 8, 1)
    same = cluster.add_pod("same", {GPU: "1"}, priority=0)
    cluster.schedule()
    assert not cluster.scheduler.evictor.done
    assert cluster.node_of(same) == ""


def test_budgets_take_one_disruption_per_covered_pod() -> None:
    def pod(name: str, prio: int, app: str) -> Unit:
        obj = {
            "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": app}},
            "spec": {"priority": prio},
        }
        return Unit((parse_pod(obj),))

    budgets = parse_budgets(
        [
            {
                "metadata": {"namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}},
                "status": {"disruptionsAllowed": 1},
            },
            {"metadata": {"namespace": "ns"}, "spec": {}},  # no selector: covers nothing
            {  # an empty selector covers nothing either (kube-scheduler's preemption)
                "metadata": {"namespace": "ns"},
                "spec": {"selector": {}},
                "status": {"disruptionsAllowed": 0},
            },
        ]
    )
    a, b, c = pod("a", 5, "db"), pod("b", 3, "db"), pod("c", 9, "web")
    violating, fine = split_by_budgets([b, c, a], budgets)
    assert violating == [b]  # a (higher priority) took the one allowed disruption
    assert fine == [c, a]


def test_nomination_read_back_after_a_restart(cluster: FakeCluster) -> None:
    cluster.add_node("n0", gpus=8)
    fill_node(cluster, 8, 1)
    high = cluster.add_pod("high", {GPU: "2"}, priority=100)
    cluster.schedule()
    (done,) = cluster.scheduler.evictor.done
    cluster.pods[high]["status"]["nominatedNodeName"] = "n0"  # what the evictor writes
    for v in done.victims:
        cluster.delete_pod(v.uid)
    cluster.restart()
    assert [p.uid for p in cluster.scheduler.nominations()["n0"]] == [high]
    late = cluster.add_pod("late", {GPU: "1"}, priority=0)
    # the two free GPUs are the nominated pod's: the late one fits nowhere
    assert cluster.scheduler.filter_nodes(parse_pod(cluster.pods[late]), "") == []
    cluster.schedule()
    assert cluster.node_of(late) == ""
    assert cluster.node_of(high) == "n0"


def high_gang(cluster: FakeCluster, name: str, size: int, gpus: int, **spec: Any) -> list[str]:
    ann = {A.gang_group: name, A.gang_min_members: str(size)}
    return [
        cluster.add_pod(f"{name}-{i}", {GPU: str(gpus)}, annotations=ann, priority=100, **spec)
        for i in range(size)
    ]


def test_a_gang_preempts_as_a_whole(cluster: FakeCluster) -> None:
    for n in ("n0", "n1", "n2"):
        cluster.add_node(n, gpus=8, labels={L.runtime_version: "v1.15.0"})
    low = [cluster.add_pod(f"low-{i}", {GPU: "2"}, priority=0) for i in range(12)]
    cluster.schedule()
    assert all(cluster.node_of(u) for u in low)
    members = high_gang(cluster, "g", 2, 8)
    cluster.schedule()
    done = cluster.scheduler.evictor.done
    victims = [v for p in done for v in p.victims]
    assert len(victims) == 8  # two whole nodes, not a pod more
    assert len({v.node_name for v in victims}) == 2
    assert {p.pod.uid for p in done} <= set(members)
    assert not any(cluster.node_of(u) for u in members)  # nothing placed before they go
    # tried again while its victims are still there: no second preemption
    cluster.scheduler.queue.activate(members)
    cluster.schedule()
    assert len(cluster.scheduler.evictor.done) == len(done)
    late = cluster.add_pod("late", {GPU: "2"}, priority=0)
    for v in victims:
        cluster.delete_pod(v.uid)
    cluster.schedule()
    assert sorted(cluster.node_of(u) for u in members) == sorted({v.node_name for v in victims})
    assert cluster.node_of(late) == ""  # the claimed nodes were the gang's


def test_a_gang_that_would_not_fit_evicts_nobody(cluster: FakeCluster) -> None:
    for n in ("n0", "n1", "n2"):
        cluster.add_node(n, gpus=8, labels={L.runtime_version: "v1.15.0"})
    low = [cluster.add_pod(f"low-{i}", {GPU: "4"}, priority=0) for i in range(4)]
    low.append(cluster.add_pod("higher", {GPU: "8"}, priority=1000))
    cluster.schedule()
    assert all(cluster.node_of(u) for u in low)
    # two nodes of lower-priority pods could be emptied; the third runs a higher one
    members = high_gang(cluster, "big", 3, 8)
    cluster.schedule()
    assert not cluster.scheduler.evictor.done
    assert any("fits nowhere even without" in e for e in cluster.events(members[0]))
    never = high_gang(cluster, "never", 2, 8, preemptionPolicy="Never")
    cluster.schedule()
    assert not cluster.scheduler.evictor.done
    assert any("preemptionPolicy=Never" in e for e in cluster.events(never[0]))


def evicted(cluster: FakeCluster, preemptor: str, node: str, victims: list[str]) -> None:
    """What the evictor writes: the nomination, then each victim's DisruptionTarget
    condition and deletion (the victims still terminating)."""
    cluster.pods[preemptor]["status"]["nominatedNodeName"] = node
    for uid in victims:
        cluster.pods[uid]["status"]["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ]
        cluster.terminate_pod(uid)


def test_no_second_preemption_after_a_restart_while_victims_terminate(
    cluster: FakeCluster,
) -> None:
    for n in ("n0", "n1"):
        cluster.add_node(n, gpus=8, labels={"slot": n})
    low = [
        cluster.add_pod(f"low-{n}", {GPU: "8"}, priority=0, nodeSelector={"slot": n})
        for n in ("n0", "n1")
    ]
    cluster.schedule()
    high = cluster.add_pod("high", {GPU: "8"}, priority=100)
    cluster.schedule()
    (done,) = cluster.scheduler.evictor.done
    victims = [v.uid for v in done.victims]
    evicted(cluster, high, done.node, victims)
    cluster.restart()  # what the victims were lives only in the cluster now
    cluster.scheduler.queue.activate([high])
    cluster.schedule()
    assert cluster.scheduler.evictor.done == []
    assert any(e.endswith(NOT_ELIGIBLE) for e in cluster.events(high))
    for uid in victims:
        cluster.delete_pod(uid)
    cluster.scheduler.queue.activate([high])  # not waiting out its backoff
    cluster.schedule()
    assert cluster.node_of(high) == done.node
    assert [u for u in low if u in cluster.pods] == [u for u in low if u not in victims]


def test_failure_messages_read_as_kube_schedulers(cluster: FakeCluster) -> None:
    cluster.add_node("a", labels={"zone": "a"})
    cluster.add_node("b", labels={"zone": "b"})
    cluster.add_node("c", labels={"zone": "b"}, gpus=2)
    cluster.add_pod("full", {GPU: "8"}, priority=10, nodeSelector={"zone": "a"})
    cluster.schedule()
    same = cluster.add_pod("same", {GPU: "4"}, priority=10, nodeSelector={"zone": "a"})
    cpu = cluster.add_pod("cpu", {GPU: "1", "cpu": "200"}, priority=100, nodeSelector={"zone": "a"})
    cluster.schedule()
    assert cluster.events(same, "FailedScheduling") == [
        f"0/3 nodes are available: 1 Insufficient {GPU}, 2 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/3 nodes are available: 1 No preemption victims found "
        "for incoming pod, 2 Preemption is not helpful for scheduling."
    ]
    assert cluster.events(cpu, "FailedScheduling") == [
        f"0/3 nodes are available: 1 Insufficient {GPU}, 2 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/3 nodes are available: 1 Insufficient cpu, 2 "
        "Preemption is not helpful for scheduling."
    ]
    high = cluster.add_pod("high", {GPU: "4"}, priority=100, nodeSelector={"zone": "a"})
    cluster.schedule()
    # a preemption that nominates a node adds nothing to the message (as upstream)
    assert cluster.events(high, "FailedScheduling") == [
        f"0/3 nodes are available: 1 Insufficient {GPU}, 2 node(s) didn't match Pod's node "
        "affinity/selector."
    ]
    assert any("Preempting 1 lower-priority pod(s) on node a" in e for e in cluster.events(high))


def test_a_gang_does_not_preempt_again_after_a_restart_while_victims_terminate(
    cluster: FakeCluster,
) -> None:
    for n in ("n0", "n1", "n2", "n3"):
        cluster.add_node(n, gpus=8, labels={L.runtime_version: "v1.15.0"})
    low = [cluster.add_pod(f"low-{i}", {GPU: "2"}, priority=0) for i in range(16)]
    cluster.schedule()
    members = high_gang(cluster, "g", 2, 8)
    cluster.schedule()
    done = cluster.scheduler.evictor.done
    assert len([v for p in done for v in p.victims]) == 8
    for p in done:
        evicted(cluster, p.pod.uid, p.node, [v.uid for v in p.victims])
    cluster.restart()
    cluster.scheduler.queue.activate(members)
    cluster.schedule()
    assert cluster.scheduler.evictor.done == []  # the two other nodes' pods stay
    assert any(e.endswith(NOT_ELIGIBLE) for u in members for e in cluster.events(u))
    assert len([u for u in low if not cluster.pods[u]["metadata"].get("deletionTimestamp")]) == 8
