"""Preemption by lj-scheduler processes on the real control plane with KWOK nodes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch

from lj_runtimekit.envtest.kwok import KEEP_TERMINATING_ANNOTATION
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.scheduler.process import (
    SchedulerProcess,
    annotate_inventory,
)
from lj_runtimekit.testkit.scheduler.process import bound_pods as bound
from lj_runtimekit.testkit.scheduler.process import pod_events as events
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("runtime_class", "priorities")]
P = load_protocol()
GPU = P.resources.gpu
SLICE = {P.resources.core: "60", P.resources.memory: "10"}
PRIORITIES = {"lj-test-low": 10, "lj-test-mid": 20, "lj-test-high": 1000, "lj-test-never": 1000}


@pytest.fixture
def priorities(api_client: k8s_client.ApiClient) -> None:
    """PriorityClasses the pods name (the API server sets spec.priority from them)."""
    api = k8s_client.SchedulingV1Api(api_client)
    for name, value in PRIORITIES.items():
        body: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
        body |= {"metadata": {"name": name}, "value": value}
        if name == "lj-test-never":
            body["preemptionPolicy"] = "Never"
        try:
            api.create_priority_class(body)
        except k8s_client.ApiException as exc:
            if exc.status != 409:
                raise


@pytest.fixture
def disruption_conditions(
    api_client: k8s_client.ApiClient, namespace: str
) -> Iterator[dict[str, str]]:
    """Pod name -> reason of a DisruptionTarget condition seen on it by a watch."""
    seen: dict[str, str] = {}
    w = k8s_watch.Watch()
    core = k8s_client.CoreV1Api(api_client)
    stopping = threading.Event()

    def run() -> None:
        try:
            for ev in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=300):
                obj = ev["object"]
                for c in obj.status.conditions or ():
                    if c.type == "DisruptionTarget" and c.status == "True":
                        seen[obj.metadata.name] = c.reason
        except Exception:
            if not stopping.is_set():  # the stream cut as the test ends is not a failure
                raise

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield seen
    stopping.set()
    w.stop()


def make(name: str, ns: str, sel: dict[str, str], limits: dict[str, str], prio: str) -> Any:
    return pod(
        name,
        f"lj-{ns}",
        sel,
        limits,
        priorityClassName=prio,
        terminationGracePeriodSeconds=0,
    )


def fill(core: k8s_client.CoreV1Api, ns: str, pods: dict[str, Any]) -> None:
    for body in pods.values():
        core.create_namespaced_pod(ns, body)
    wait_for(lambda: set(pods) <= set(bound(core, ns)), 60, "low-priority pods bound")


def names(core: k8s_client.CoreV1Api, ns: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(ns).items}


def test_whole_gpu_preemption_takes_the_node_with_fewest_victims(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
    disruption_conditions: dict[str, str],
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    n0 = node_factory.create(f"{ns}-n0", labels={"slot": "a"})
    n1 = node_factory.create(f"{ns}-n1", labels={"slot": "b"})
    for n in (n0, n1):
        annotate_inventory(core, n)
    low = {
        f"one-{i}": make(f"one-{i}", ns, {**sel, "slot": "a"}, {GPU: "1"}, "lj-test-low")
        for i in range(8)
    }
    for i in range(2):
        low[f"four-{i}"] = make(f"four-{i}", ns, {**sel, "slot": "b"}, {GPU: "4"}, "lj-test-low")
    fill(core, ns, low)
    # preemptionPolicy Never: waits, evicts nobody
    core.create_namespaced_pod(ns, make("never", ns, sel, {GPU: "4"}, "lj-test-never"))
    wait_for(
        lambda: any("preemptionPolicy=Never" in e for e in events(core, ns, "never")),
        60,
        "Never pod's reason",
        describe=lambda: str(events(core, ns, "never")) + scheduler.text(),
    )
    assert names(core, ns) == set(low) | {"never"}
    core.delete_namespaced_pod("never", ns, grace_period_seconds=0)
    # four GPUs: one victim on n1 rather than four on n0
    core.create_namespaced_pod(ns, make("high", ns, sel, {GPU: "4"}, "lj-test-high"))
    wait_for(
        lambda: "high" in bound(core, ns),
        60,
        "high-priority pod bound",
        describe=lambda: str(events(core, ns, "high")) + scheduler.text(),
    )
    assert bound(core, ns)["high"].spec.node_name == n1
    gone = set(low) - names(core, ns)
    (victim,) = gone
    assert victim in {"four-0", "four-1"}
    assert any(f"Preempted by pod {ns}/high" in e for e in events(core, ns, victim))
    assert any(
        f"Preempting 1 lower-priority pod(s) on node {n1}" in e for e in events(core, ns, "high")
    )
    wait_for(
        lambda: disruption_conditions.get(victim) == "PreemptionByScheduler",
        10,
        "DisruptionTarget condition on the victim",
        describe=lambda: str(disruption_conditions),
    )


def test_slice_victim(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    node = node_factory.create(f"{ns}-n0")
    annotate_inventory(core, node)
    low = {f"s{i}": make(f"s{i}", ns, sel, SLICE, "lj-test-low") for i in range(8)}
    fill(core, ns, low)  # 60 % of every GPU taken
    core.create_namespaced_pod(ns, make("mid", ns, sel, SLICE, "lj-test-low"))
    core.create_namespaced_pod(ns, make("high", ns, sel, SLICE, "lj-test-high"))
    wait_for(
        lambda: "high" in bound(core, ns),
        60,
        "high-priority slice bound",
        describe=lambda: str(events(core, ns, "high")) + scheduler.text(),
    )
    assert len(set(low) - names(core, ns)) == 1  # one slice made room for one slice
    assert "mid" not in bound(core, ns)  # same priority as the others: preempts nobody


def test_pod_disruption_budget_respected(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    for slot in ("a", "b"):
        annotate_inventory(core, node_factory.create(f"{ns}-{slot}", labels={"slot": slot}))
    guarded = make("guarded", ns, {**sel, "slot": "a"}, {GPU: "8"}, "lj-test-low")
    guarded["metadata"]["labels"] = {"app": "guarded"}
    # without the budget the lowest-priority victim (guarded, 10) would go, not other (20)
    other = make("other", ns, {**sel, "slot": "b"}, {GPU: "8"}, "lj-test-mid")
    fill(core, ns, {"guarded": guarded, "other": other})
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    k8s_client.PolicyV1Api(api_client).create_namespaced_pod_disruption_budget(ns, pdb)
    core.create_namespaced_pod(ns, make("high", ns, sel, {GPU: "8"}, "lj-test-high"))
    wait_for(
        lambda: "high" in bound(core, ns),
        60,
        "high-priority pod bound",
        describe=lambda: str(events(core, ns, "high")) + scheduler.text(),
    )
    assert bound(core, ns)["high"].spec.node_name == f"{ns}-b"
    assert names(core, ns) == {"guarded", "high"}


def test_gang_evicted_whole_or_not_at_all(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    labels = {P.labels.runtime_version: "v1.15.0"}
    for i in range(3):
        node_factory.create(f"{ns}-n{i}", topology_block="b0", topology_switch="s0", labels=labels)
    gang = {P.annotations.gang_group: "g", P.annotations.gang_min_members: "2"}
    pods = {f"g-{i}": make(f"g-{i}", ns, sel, {GPU: "8"}, "lj-test-low") for i in range(2)}
    for body in pods.values():
        body["metadata"]["annotations"] = dict(gang)
    fill(core, ns, pods)
    fill(core, ns, {"solo": make("solo", ns, sel, {GPU: "8"}, "lj-test-mid")})
    # the gang's members have the lowest priority: one of them alone would make room,
    # but a gang goes whole (two victims) or not at all
    core.create_namespaced_pod(ns, make("high", ns, sel, {GPU: "8"}, "lj-test-high"))
    wait_for(
        lambda: "high" in bound(core, ns),
        60,
        "high-priority pod bound",
        describe=lambda: str(events(core, ns, "high")) + scheduler.text(),
    )
    assert names(core, ns) == {"solo", "high"}
    assert any("Preempting 2 lower-priority pod(s)" in e for e in events(core, ns, "high"))


def test_gang_preempts_as_a_whole_or_not_at_all(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
    disruption_conditions: dict[str, str],
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    labels = {P.labels.runtime_version: "v1.15.0"}
    nodes = [
        node_factory.create(f"{ns}-n{i}", topology_block="b0", topology_switch="s0", labels=labels)
        for i in range(3)
    ]
    for n in nodes:
        annotate_inventory(core, n)
    fill(core, ns, {"blocker": make("blocker", ns, sel, {GPU: "8"}, "lj-test-high")})
    full = {bound(core, ns)["blocker"].spec.node_name}
    low = {f"low-{i}": make(f"low-{i}", ns, sel, {GPU: "1"}, "lj-test-low") for i in range(16)}
    fill(core, ns, low)  # the two other nodes full

    def gang(name: str, size: int, prio: str) -> list[str]:
        ann = {P.annotations.gang_group: name, P.annotations.gang_min_members: str(size)}
        members = [f"{name}-{i}" for i in range(size)]
        for m in members:
            body = make(m, ns, sel, {GPU: "8"}, prio)
            body["metadata"]["annotations"] = ann
            core.create_namespaced_pod(ns, body)
        return members

    # three whole nodes: two could be emptied, the third runs a pod of higher priority
    big = gang("big", 3, "lj-test-mid")
    wait_for(
        lambda: any("fits nowhere even without" in e for m in big for e in events(core, ns, m)),
        60,
        "the gang's reason",
        describe=lambda: str({m: events(core, ns, m) for m in big}) + scheduler.text(),
    )
    assert names(core, ns) == set(low) | {"blocker"} | set(big)  # nothing evicted
    assert not disruption_conditions
    for m in big:
        core.delete_namespaced_pod(m, ns, grace_period_seconds=0)
    wait_for(lambda: not set(big) & names(core, ns), 60, "the first gang gone")
    # two whole nodes: the sixteen one-GPU pods on them go, the gang is placed whole
    g = gang("g", 2, "lj-test-high")
    wait_for(
        lambda: set(g) <= set(bound(core, ns)),
        60,
        "the gang bound through preemption",
        describe=lambda: str({m: events(core, ns, m) for m in g}) + scheduler.text(),
    )
    placed = bound(core, ns)
    assert {placed[m].spec.node_name for m in g} == set(nodes) - full
    assert names(core, ns) == {"blocker", *g}
    assert all(any(f"Preempted by pod {ns}/g-" in e for e in events(core, ns, v)) for v in low)
    assert any("Preempting 8 lower-priority pod(s)" in e for m in g for e in events(core, ns, m))
    wait_for(
        lambda: set(disruption_conditions) == set(low),
        10,
        "DisruptionTarget condition on every victim",
        describe=lambda: str(disruption_conditions),
    )
    assert set(disruption_conditions.values()) == {"PreemptionByScheduler"}


HOLD = "lj-test/hold"
"""A finalizer that keeps a deleted pod terminating until the test removes it (KWOK leaves
pods annotated KEEP_TERMINATING_ANNOTATION alone)."""


def test_no_second_preemption_after_a_restart_while_the_victim_terminates(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
    disruption_conditions: dict[str, str],
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    ns, sel = namespace, node_factory.selector
    for slot in ("a", "b"):
        annotate_inventory(core, node_factory.create(f"{ns}-{slot}", labels={"slot": slot}))
    low = {}
    for slot, prio in (("a", "lj-test-low"), ("b", "lj-test-mid")):
        body = make(f"low-{slot}", ns, {**sel, "slot": slot}, {GPU: "8"}, prio)
        body["metadata"]["finalizers"] = [HOLD]
        body["metadata"]["annotations"] = {KEEP_TERMINATING_ANNOTATION: "true"}
        low[f"low-{slot}"] = body

    def terminating() -> set[str]:
        items = core.list_namespaced_pod(ns).items
        return {p.metadata.name for p in items if p.metadata.deletion_timestamp}

    try:
        fill(core, ns, low)
        core.create_namespaced_pod(ns, make("high", ns, sel, {GPU: "8"}, "lj-test-high"))
        wait_for(terminating, 60, "a victim terminating", describe=scheduler.text)
        assert terminating() == {"low-a"}  # the lower priority of the two
        wait_for(
            lambda: core.read_namespaced_pod("high", ns).status.nominated_node_name,
            30,
            "the preemptor nominated",
        )
        scheduler.kill()  # what it chose to evict lives only in the cluster now
        before = len(scheduler.text())
        scheduler.start()
        wait_for(
            lambda: (
                "not eligible due to a terminating pod on the nominated node."
                in scheduler.text()[before:]
            ),
            60,
            "the restarted scheduler's refusal to preempt again",
            describe=lambda: scheduler.text()[before:][-3000:],
        )
        assert terminating() == {"low-a"}  # low-b was not preempted in its place
        assert set(disruption_conditions) == {"low-a"}
        core.patch_namespaced_pod("low-a", ns, {"metadata": {"finalizers": None}})
        wait_for(
            lambda: "high" in bound(core, ns),
            60,
            "the preemptor bound where its victim was",
            describe=lambda: str(events(core, ns, "high")) + scheduler.text()[before:][-3000:],
        )
        assert bound(core, ns)["high"].spec.node_name == f"{ns}-a"
        assert "low-b" in bound(core, ns)
    finally:
        for name in low:
            try:
                core.patch_namespaced_pod(name, ns, {"metadata": {"finalizers": None}})
            except k8s_client.ApiException as exc:
                if exc.status != 404:
                    raise
