"""The cache's ranked node indexes stay exact while nodes move between buckets."""

from __future__ import annotations

import pytest

from lj_runtimekit.schedulerframework.internal.cache.cache import RankedBuckets
from lj_runtimekit.testkit.imports import official_client_loaded_by
from lj_runtimekit.testkit.scheduler.fake import GPU, FakeCluster


def test_ranked_buckets_order_and_moves() -> None:
    b = RankedBuckets()
    for name, value in (("c", 8), ("a", 8), ("b", 3), ("d", 0)):
        b.move(name, None, value)
    assert b.ranked(1, ascending=True) == ["b", "a", "c"]
    assert b.ranked(0, ascending=False) == ["a", "c", "b", "d"]
    b.move("a", 8, 2)  # the listed bucket changed: its cached order must not be reused
    assert b.ranked(1, ascending=True) == ["a", "b", "c"]
    b.move("c", 8, None)
    assert b.ranked(4, ascending=True) == []
    assert b.ranked(0, ascending=True) == ["d", "a", "b"]


class _Name(str):
    """A node name that counts the comparisons made on it."""

    compared = 0

    def __lt__(self, other: str) -> bool:
        _Name.compared += 1
        return str.__lt__(self, other)


def test_ranked_buckets_list_without_sorting_again() -> None:
    # A cycle lists the ranked nodes after one node moved: with thousands of nodes in a
    # bucket that must cost a bisection, not a sort of the bucket (O(n log n) per cycle).
    b = RankedBuckets()
    names = [_Name(f"gpu-{i:04d}") for i in range(1024)]
    for name in names:
        b.move(name, None, 8)
    assert b.ranked(1, ascending=True) == names
    _Name.compared = 0
    b.move(names[500], 8, 7)
    listed = b.ranked(1, ascending=True)
    assert listed == [names[500], *names[:500], *names[501:]]
    assert _Name.compared <= 40  # 2 x log2(1024) bisection steps, with room


def test_free_index_follows_binds_deletes_and_node_removal(cluster: FakeCluster) -> None:
    for name in ("n1", "n2", "n3"):
        cluster.add_node(name, gpus=4)
    cache = cluster.scheduler.cache
    assert cache.nodes_with_free("gpu", 1, ascending=True) == ["n1", "n2", "n3"]
    uid = cluster.add_pod("p", {GPU: "3"})
    cluster.schedule()
    busy = cluster.node_of(uid)
    others = sorted({"n1", "n2", "n3"} - {busy})
    assert cache.nodes_with_free("gpu", 1, ascending=True) == [busy, *others]
    assert cache.nodes_with_free("gpu", 2, ascending=True) == others
    assert cache.nodes_with_free("gpu", 1, ascending=False) == [*others, busy]
    cluster.delete_pod(uid)
    assert cache.nodes_with_free("gpu", 4, ascending=True) == ["n1", "n2", "n3"]
    cluster.scheduler.on_node("DELETED", {"metadata": {"name": "n2"}})
    assert cache.nodes_with_free("gpu", 1, ascending=True) == ["n1", "n3"]


def test_scheduler_starts_without_the_official_client() -> None:
    # Importing the official client took seconds of every start (a failover waits on it).
    assert official_client_loaded_by("lj_runtimekit.schedulerframework.cmd.scheduler.main") == []


def test_assume_never_replaces_a_pod_confirmed_bound(cluster: FakeCluster) -> None:
    cluster.add_node("n0")
    uid = cluster.add_pod("p", {GPU: "4"})
    cluster.schedule()
    cache = cluster.scheduler.cache
    state = cache.pods[uid]
    with pytest.raises(ValueError, match="pod default/p is bound to node n0: not assumed again"):
        cache.assume_pod(state.pod, "n0")
    assert cache.pods[uid] is state
    assert cache.free_whole("gpu", "n0") == 4
