"""Property: the sharing invariant (docs/architecture.md, Sharing) holds after every step.

Random sequences of pod creation (whole devices, slices, MIG), scheduling
(binding through the in-memory API server double, sometimes failing), pod
deletion and scheduler restarts. A restart builds a new Scheduler from the
stored Node and Pod objects only (what a process sees after list + watch), so
the rebuilt accounting is exercised; the invariant is checked both on the
scheduler's cache and, independently, on the pods' assignment annotations.
This runs on the in-memory framework, not on the real control plane.

Gangs (pod groups of 2-3 members asking for one GPU each) join the mix: after
every step no gang has some but not all of its minimum bound. Injected bind
failures hit only non-gang pods: a bind API error after a gang was allowed is
the one way to a transient partial gang (README "Gang scheduling").
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.types import Status
from lj_runtimekit.testkit.invariant import assignment_holdings, sharing_violations
from lj_runtimekit.testkit.scheduler.fake import (
    CORE,
    GPU,
    MEM,
    PROTOCOL,
    FakeCluster,
    nvlink_inventory,
)

MIG = PROTOCOL.resources.mig("1g.10gb")
GANG = PROTOCOL.annotations.gang_group
GANG_MIN = PROTOCOL.annotations.gang_min_members


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster = FakeCluster()
        self.cluster.add_node("a", inventory=nvlink_inventory("a", count=4, groups=2))
        self.cluster.add_node(
            "b",
            gpus=3,
            inventory=nvlink_inventory("b", count=4, groups=2, mig={3: ["1g.10gb"] * 3}),
            extra={MIG: "3"},
        )
        self.cluster.add_node("c", gpus=2)  # no inventory: capacity fallback
        self.n = 0
        self.gone: dict[str, int] = {}
        bind = self.cluster._bind

        def bind_failing_non_gang(pod: PodInfo, node: str, ann: Mapping[str, str]) -> Status:
            held = self.cluster.fail_binds
            if GANG in pod.annotations:
                self.cluster.fail_binds = 0
            try:
                return bind(pod, node, ann)
            finally:
                if GANG in pod.annotations:
                    self.cluster.fail_binds = held

        self.cluster._bind = bind_failing_non_gang  # type: ignore[method-assign,assignment]
        self.cluster.scheduler.bind_pod = bind_failing_non_gang  # type: ignore[method-assign,assignment]

    @rule(k=st.integers(1, 3))
    def create_whole(self, k: int) -> None:
        self.n += 1
        self.cluster.add_pod(f"w{self.n}", {GPU: str(k)})

    @rule(c=st.integers(5, 70), m=st.integers(5, 70))
    def create_slice(self, c: int, m: int) -> None:
        self.n += 1
        self.cluster.add_pod(f"s{self.n}", {CORE: str(c), MEM: str(m)})

    @rule()
    def create_mig(self) -> None:
        self.n += 1
        self.cluster.add_pod(f"m{self.n}", {MIG: "1"})

    @rule(two=st.booleans())
    def create_two_containers(self, two: bool) -> None:
        self.n += 1
        second = {GPU: "1"} if two else {CORE: "30", MEM: "30"}
        self.cluster.add_pod(f"x{self.n}", [{CORE: "50", MEM: "20"}, second])

    @rule(size=st.integers(2, 3))
    def create_gang(self, size: int) -> None:
        self.n += 1
        ann = {GANG: f"gang{self.n}", GANG_MIN: str(size)}
        for i in range(size):
            self.cluster.add_pod(f"gang{self.n}-{i}", {GPU: "1"}, annotations=ann)

    @rule(fail=st.integers(0, 2))
    def schedule(self, fail: int) -> None:
        self.cluster.fail_binds = fail
        q = self.cluster.scheduler.queue
        with q._cond:  # let backed-off and unschedulable pods try again now
            q._backoff[:] = [(0.0, s, u) for (_, s, u) in q._backoff]
        q.move_all_to_active_or_backoff()
        with q._cond:
            q._backoff[:] = [(0.0, s, u) for (_, s, u) in q._backoff]
        self.cluster.schedule()
        self.cluster.fail_binds = 0

    @precondition(lambda self: bool(self.cluster.pods))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        uid = data.draw(st.sampled_from(sorted(self.cluster.pods)))
        obj = self.cluster.pods[uid]
        group = obj["metadata"]["annotations"].get(GANG)
        if group is not None and obj["spec"].get("nodeName"):
            self.gone[group] = self.gone.get(group, 0) + 1  # a member that ran, then died
        self.cluster.delete_pod(uid)

    @rule()
    def restart(self) -> None:
        self.cluster.restart()

    @invariant()
    def sharing_invariant(self) -> None:
        assert self.cluster.scheduler.cache.violations() == []
        holdings = assignment_holdings(self.cluster.pods.values(), PROTOCOL)
        assert sharing_violations("scheduler", holdings) == []

    @invariant()
    def accounting_matches_bound_pods(self) -> None:
        cache = self.cluster.scheduler.cache
        bound = {u for u, o in self.cluster.pods.items() if o["spec"].get("nodeName")}
        waiting = {w.pod.uid for w in self.cluster.scheduler.iterate_waiting_pods()}
        assert bound <= set(cache.pods)
        # nothing assumed is left behind after a step, except gang members waiting at Permit
        assert set(cache.pods) - bound <= waiting

    @invariant()
    def no_partial_gang_bound(self) -> None:
        bound: dict[str, int] = {}
        minimum: dict[str, int] = {}
        for obj in self.cluster.pods.values():
            ann = obj["metadata"]["annotations"]
            if GANG in ann:
                minimum[ann[GANG]] = int(ann[GANG_MIN])
                bound[ann[GANG]] = bound.get(ann[GANG], 0) + bool(obj["spec"].get("nodeName"))
        partial = {g: n for g, n in bound.items() if n > 0 and n + self.gone.get(g, 0) < minimum[g]}
        assert not partial, f"partial gangs bound: {partial}"

    def teardown(self) -> None:
        self.cluster.scheduler.stop()


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
