"""DeviceTopology: a pod asking for several whole devices gets the best-connected set.

Sets are ranked by their interconnect (sum over device pairs of the link score:
NVLink >> PCIe), then by how many pairs share a NUMA node. Nodes are scored by
the best set they can still offer, so a pod goes where its set is best.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.cache.devices import (
    LINK_SCORE,
    SAME_NUMA_SCORE,
    DeviceState,
)
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.args import ArgsError, check_fields
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    MAX_NODE_SCORE,
    Handle,
    PreFilterPlugin,
    ScorePlugin,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SKIP,
    SUCCESS,
    CycleState,
    PreFilterResult,
    Status,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import (
    CHOOSER_KEY,
    device_request,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.request import RequestError

NAME = "DeviceTopology"
ASK_KEY = "DeviceTopology/ask"
PAIR_IDEAL = max(LINK_SCORE.values()) * 1000 + SAME_NUMA_SCORE


@dataclass(frozen=True)
class Args:
    max_exhaustive_sets: int = 256
    """Above this many candidate sets, the set is grown greedily instead."""

    @staticmethod
    def parse(raw: Mapping[str, Any]) -> Args:
        check_fields(NAME, raw, ("maxExhaustiveSets",))
        value = raw.get("maxExhaustiveSets", 256)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgsError(
                f"pluginConfig {NAME}: args.maxExhaustiveSets must be an integer >= 1, "
                f"got {value!r}"
            )
        return Args(value)


def pair_score(a: DeviceState, b: DeviceState) -> int:
    """Interconnect dominates; sharing a NUMA node breaks ties."""
    link = a.links.get(b.id, 0)
    numa = SAME_NUMA_SCORE if a.numa >= 0 and a.numa == b.numa else 0
    return link * 1000 + numa


def set_quality(devices: Sequence[DeviceState]) -> int:
    return sum(pair_score(a, b) for a, b in itertools.combinations(devices, 2))


def _broken_links(chosen: Sequence[DeviceState], free_ids: set[str]) -> int:
    """Fast links from the chosen devices to devices left free (islands broken)."""
    ids = {d.id for d in chosen}
    fast = max(LINK_SCORE.values())
    return sum(
        1
        for d in chosen
        for peer, score in d.links.items()
        if score == fast and peer in free_ids and peer not in ids
    )


def best_set(
    free: Sequence[DeviceState], count: int, max_exhaustive: int = 256
) -> list[DeviceState]:
    """The `count` free devices with the best interconnect.

    Ties go to the set that breaks the fewest fast links to devices left free
    (whole NVLink islands stay available for bigger pods), then to the lowest
    indexes.
    """
    free = sorted(free, key=lambda d: d.index)
    if count >= len(free):
        return list(free)
    if count <= 0:
        return []
    free_ids = {d.id for d in free}
    if math.comb(len(free), count) <= max_exhaustive:
        best: tuple[DeviceState, ...] = ()
        best_key: tuple[int, int] | None = None
        for combo in itertools.combinations(free, count):
            key = (set_quality(combo), -_broken_links(combo, free_ids))
            if best_key is None or key > best_key:
                best, best_key = combo, key
        return list(best)
    # Greedy: grow from each seed, always adding the device best linked to the set.
    best_list: list[DeviceState] = []
    best_q = -1
    for seed in free:
        chosen = [seed]
        rest = [d for d in free if d is not seed]
        while len(chosen) < count:
            nxt = max(rest, key=lambda d: (sum(pair_score(d, c) for c in chosen), -d.index))
            chosen.append(nxt)
            rest.remove(nxt)
        q = set_quality(chosen)
        if q > best_q:
            best_list, best_q = sorted(chosen, key=lambda d: d.index), q
    return best_list


class DeviceTopology(PreFilterPlugin, ScorePlugin):
    name = NAME

    def __init__(self, args: Args, handle: Handle) -> None:
        self.args = args
        self.handle = handle
        self._memo: dict[tuple[str, int, str, int], int] = {}

    def choose(self, free: Sequence[DeviceState], count: int, policy: str) -> list[DeviceState]:
        return best_set(free, count, self.args.max_exhaustive_sets)

    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        try:
            req = device_request(pod, self.handle)
        except RequestError:
            return None, SKIP  # GpuShare reports it
        if req is None:
            return None, SKIP
        asks = [a for a in req.asks if a.whole]
        if not asks:
            return None, SKIP
        state.write(CHOOSER_KEY, self.choose)
        biggest = max(asks, key=lambda a: a.whole)
        if biggest.whole < 2:
            state.skip_score.add(NAME)  # one device: every node offers the same "set"
            return None, SUCCESS
        state.write(ASK_KEY, (biggest.kind, biggest.whole))
        return None, SUCCESS

    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        ask = state.read(ASK_KEY)
        if not isinstance(ask, tuple):
            return 0
        kind, count = ask
        devs = node.devices
        if not devs.from_inventory:
            return 0
        key = (node.name, devs.version, kind, count)
        q = self._memo.get(key)
        if q is None:
            free = devs.free_whole(kind)
            q = (
                set_quality(best_set(free, count, self.args.max_exhaustive_sets))
                if len(free) >= count
                else 0
            )
            if len(self._memo) > 50000:
                self._memo.clear()
            self._memo[key] = q
        ideal = PAIR_IDEAL * count * (count - 1) // 2
        return min(MAX_NODE_SCORE, q * MAX_NODE_SCORE // ideal) if ideal else 0


def new(args: Args, handle: Handle) -> DeviceTopology:
    return DeviceTopology(args, handle)
