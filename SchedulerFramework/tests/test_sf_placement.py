"""networktopology.placement: the smallest domain, Jobs closest, required/preferred, exclusive."""

from __future__ import annotations

import pytest

from lj_runtimekit.schedulerframework.internal.plugins.networktopology.placement import (
    Candidate,
    PlacementError,
    domains_used,
    plan,
)


def cands(blocks: int, switches: int, nodes: int, slots: int = 1, job: str = "") -> list[Candidate]:
    return [
        Candidate(f"b{b}s{s}n{n}", {job: slots}, f"b{b}", f"s{s}", {"rack": f"r{b}{s}"})
        for b in range(blocks)
        for s in range(switches)
        for n in range(nodes)
    ]


def test_best_fit_switch_then_block() -> None:
    cs = cands(2, 2, 4)
    by_name = {c.name: c for c in cs}
    p, how = plan(cs, {"": 3}, topology=True, required=True)
    assert how == "in one switch"
    assert len(domains_used(p, by_name, "switch")) == 1
    p, how = plan(cs, {"": 6}, topology=True, required=True)
    assert how == "in one block"
    assert len(domains_used(p, by_name, "block")) == 1


def test_best_fit_prefers_the_tightest_domain() -> None:
    cs = cands(1, 2, 4)
    cs = [c for c in cs if not c.name.startswith("b0s1n3")]  # switch s1 has 3 nodes
    p, _ = plan(cs, {"": 3}, topology=True, required=True)
    assert all(n.startswith("b0s1") for n in p[""])


def test_jobs_each_on_one_switch() -> None:
    cs = [Candidate(c.name, {"a": 1, "b": 1}, c.block, c.switch) for c in cands(1, 2, 4)]
    p, _ = plan(cs, {"a": 4, "b": 4}, topology=True, required=True)
    assert {n[:4] for n in p["a"]} != {n[:4] for n in p["b"]}
    assert all(len({n[:4] for n in nodes}) == 1 for nodes in p.values())


def test_required_fails_preferred_spans_fewest_blocks() -> None:
    cs = cands(3, 2, 2)
    with pytest.raises(PlacementError, match="no single block holds the 6"):
        plan(cs, {"": 6}, topology=True, required=True)
    p, how = plan(cs, {"": 6}, topology=True, required=False)
    assert how == "across 2 blocks"
    assert sum(p[""].values()) == 6


def test_exclusive_gives_each_job_its_own_domain() -> None:
    cs = [Candidate(c.name, {"a": 1, "b": 1}, c.block, c.switch, c.labels) for c in cands(1, 3, 2)]
    p, _ = plan(cs, {"a": 2, "b": 2}, True, False, exclusive_key="rack", busy_domains={"r00"})
    racks = [{n[:4] for n in p[j]} for j in ("a", "b")]
    assert racks[0].isdisjoint(racks[1])
    assert not any(n.startswith("b0s0") for nodes in p.values() for n in nodes)
    with pytest.raises(PlacementError, match="no free domain left"):
        plan(cs, {"a": 2, "b": 2}, True, False, "rack", busy_domains={"r00", "r01"})


def test_without_topology_and_anchors() -> None:
    cs = cands(2, 2, 2, slots=2)
    p, how = plan(cs, {"": 3}, topology=False, required=False)
    assert how == "without topology"
    assert sum(p[""].values()) == 3
    p, _ = plan(cs, {"": 1}, True, True, anchors={"b1s1n0"})
    assert next(iter(p[""])).startswith("b1s1")  # rejoins the domain its gang runs in
    with pytest.raises(PlacementError, match="holds 16 of the 20"):
        plan(cs, {"": 20}, topology=False, required=False)
