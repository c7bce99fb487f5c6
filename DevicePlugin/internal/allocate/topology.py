"""Best set of whole devices by interconnect, then NUMA (pure logic).

A set scores higher with more NVLink-connected pairs (then more NVLink lanes
between its members), then fewer NUMA nodes, then lower device indices. Small
choices are searched exhaustively; large ones greedily from each seed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb

_EXHAUSTIVE_LIMIT = 3000

Score = tuple[int, int, int, int]


def _links(devices: Mapping[str, rpb.Device]) -> dict[tuple[str, str], int]:
    links: dict[tuple[str, str], int] = {}
    for dev in devices.values():
        for peer in dev.peers:
            if peer.kind == rpb.INTERCONNECT_KIND_NVLINK and peer.peer_id in devices:
                links[(dev.id, peer.peer_id)] = max(1, peer.links)
    return links


def score(chosen: Sequence[str], devices: Mapping[str, rpb.Device]) -> Score:
    """The score of a set of device IDs (higher is better)."""
    links = _links(devices)
    pairs = 0
    lanes = 0
    for a, b in itertools.combinations(chosen, 2):
        n = links.get((a, b)) or links.get((b, a)) or 0
        if n:
            pairs += 1
            lanes += n
    numa = {devices[d].numa_node for d in chosen if d in devices}
    indices = sum(devices[d].index for d in chosen if d in devices)
    return (pairs, lanes, -len(numa), -indices)


def best_set(
    available: Iterable[str],
    must_include: Iterable[str],
    size: int,
    devices: Mapping[str, rpb.Device],
) -> list[str]:
    """`size` device IDs from `available`, containing `must_include`, best connected first."""
    must = list(dict.fromkeys(must_include))
    pool = [d for d in dict.fromkeys(available) if d not in must]
    need = size - len(must)
    if need <= 0:
        return must[:size]
    if need >= len(pool):
        return must + pool
    known = {d: devices[d] for d in [*must, *pool] if d in devices}
    pool.sort(key=lambda d: (known[d].index if d in known else 1 << 30, d))
    if math.comb(len(pool), need) <= _EXHAUSTIVE_LIMIT:
        best = max(
            itertools.combinations(pool, need), key=lambda combo: score([*must, *combo], known)
        )
        return [*must, *best]
    candidates = []
    for seed in pool if not must else [None]:
        chosen = [*must, *([seed] if seed else [])]
        rest = [d for d in pool if d not in chosen]
        while len(chosen) < size:
            nxt = max(rest, key=lambda d: score([*chosen, d], known))
            chosen.append(nxt)
            rest.remove(nxt)
        candidates.append(chosen)
    return max(candidates, key=lambda c: score(c, known))
