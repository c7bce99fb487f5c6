"""Two schedulers on one cluster: a Lease per profile set, one owner per node."""

from __future__ import annotations

import logging

import pytest

from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeOwnership
from lj_runtimekit.schedulerframework.internal.config.config import (
    DEFAULT_NODE_OWNER_LABEL,
    ConfigError,
    load_config,
    parse_config,
)
from lj_runtimekit.testkit.scheduler.fake import CORE, GPU, MEM, FakeCluster

OWNER = DEFAULT_NODE_OWNER_LABEL


def test_the_lease_name_follows_the_profiles() -> None:
    assert load_config(None).leader_election.resource_name == "lj-scheduler"
    assert load_config(None, "lj-a").leader_election.resource_name == "lj-a"
    two = parse_config({"profiles": [{"schedulerName": "lj-b"}, {"schedulerName": "lj-a"}]}, "x")
    assert two.leader_election.resource_name == "lj-a.lj-b"
    explicit = parse_config({"leaderElection": {"resourceName": "mine"}}, "x", "lj-a")
    assert explicit.leader_election.resource_name == "mine"
    many = parse_config({"profiles": [{"schedulerName": f"s{i:03}x" * 8} for i in range(9)]}, "x")
    assert many.leader_election.resource_name.startswith("lj-scheduler-")
    assert len(many.leader_election.resource_name) <= 253


def test_node_ownership_settings() -> None:
    cfg = load_config(None)
    assert cfg.node_owner_label == OWNER
    assert cfg.require_node_owner is False
    cfg = parse_config({"nodeOwnerLabel": "example.com/owner", "requireNodeOwner": True}, "x")
    assert (cfg.node_owner_label, cfg.require_node_owner) == ("example.com/owner", True)
    with pytest.raises(ConfigError, match=r"x: requireNodeOwner: must be true or false"):
        parse_config({"requireNodeOwner": "yes"}, "x")
    with pytest.raises(ConfigError, match=r"x: config.nodeOwnerLabel: must be a non-empty"):
        parse_config({"nodeOwnerLabel": ""}, "x")


def owned(cluster: FakeCluster, required: bool = False) -> None:
    cluster.scheduler.cache.set_ownership(
        NodeOwnership(OWNER, frozenset({"lj-scheduler"}), required)
    )
    cluster.add_node("mine", labels={OWNER: "lj-scheduler"})
    cluster.add_node("theirs", labels={OWNER: "lj-b"})
    cluster.add_node("open")


def test_a_node_owned_by_another_scheduler_is_refused_with_the_reason(
    cluster: FakeCluster,
) -> None:
    owned(cluster)
    whole = [cluster.add_pod(f"w{i}", {GPU: "8"}) for i in range(3)]
    cluster.schedule()
    assert sorted(cluster.node_of(u) for u in whole) == ["", "mine", "open"]
    left = next(u for u in whole if not cluster.node_of(u))
    message = cluster.events(left, "FailedScheduling")[-1]
    assert "node owned by scheduler lj-b (label lingjun.com/scheduler-name)" in message
    # a pod tolerating every taint still gets no device there: the node offers none
    everything = [{"operator": "Exists"}]
    tolerant = [
        cluster.add_pod("t-whole", {GPU: "1"}, tolerations=everything),
        cluster.add_pod("t-slice", {CORE: "60", MEM: "60"}, tolerations=everything),
        cluster.add_pod("t-mixed", [{GPU: "1"}, {CORE: "10", MEM: "10"}], tolerations=everything),
    ]
    cluster.schedule()
    assert [cluster.node_of(u) for u in tolerant] == ["", "", ""]
    assert cluster.scheduler.cache.violations() == []


def test_require_node_owner_leaves_unlabelled_nodes_alone(cluster: FakeCluster) -> None:
    owned(cluster, required=True)
    pods = [cluster.add_pod(f"w{i}", {GPU: "8"}) for i in range(2)]
    cluster.schedule()
    assert sorted(cluster.node_of(u) for u in pods) == ["", "mine"]
    left = next(u for u in pods if not cluster.node_of(u))
    assert (
        "node has no owner (label lingjun.com/scheduler-name; requireNodeOwner is set)"
        in (cluster.events(left, "FailedScheduling")[-1])
    )


def test_an_owner_label_set_later_takes_effect(cluster: FakeCluster) -> None:
    owned(cluster)
    obj = cluster.nodes["open"]
    obj["metadata"]["labels"][OWNER] = "lj-b"
    cluster.scheduler.on_node("MODIFIED", obj)
    pods = [cluster.add_pod(f"w{i}", {GPU: "8"}) for i in range(2)]
    cluster.schedule()
    assert sorted(cluster.node_of(u) for u in pods) == ["", "mine"]


def test_another_schedulers_device_pods_on_an_unowned_node_are_warned_about(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    owned(cluster)
    one = '{"c0":[{"id":"0"}]}'
    with caplog.at_level(logging.WARNING):
        cluster.add_bound_pod("theirs-1", "open", one, 1)
        cluster.add_bound_pod("theirs-2", "open", '{"c0":[{"id":"1"}]}', 1)
        cluster.add_bound_pod("theirs-3", "mine", one, 1)  # labelled: its owner decides
    warnings = [r.getMessage() for r in caplog.records if "no owner label" in r.getMessage()]
    assert len(warnings) == 1
    assert "node open has device pods placed by scheduler someone-else" in warnings[0]
    assert cluster.scheduler.cache.violations() == []
