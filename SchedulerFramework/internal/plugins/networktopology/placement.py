"""Where a gang goes in the network: the smallest domain that holds it (pure, no I/O).

Nodes carry topology labels of two levels (protocol keys
`labels.topology_switch` under `labels.topology_block`, docs/architecture.md). A gang asks for
members grouped by Job (the pods that talk most); each node offers a number of
member slots per Job (how many copies of that Job's pod fit there now).

`plan` returns how many members of each Job go to which node:

- topology on: the smallest switch that holds the whole gang, else the
  smallest block, best fit (least room left over, then name); within it each
  Job goes to one switch when one can hold it, else to the fewest switches.
  When no single block holds the gang, `required` fails with the reason and
  `preferred` spans the fewest blocks (largest first).
- `exclusive` (JobSet `alpha.jobset.sigs.k8s.io/exclusive-topology`): every
  Job gets a whole domain of that label key that no other Job uses.
- topology off (feature gate): any feasible nodes, fullest first (binpack).

`anchors` are nodes already running members of the gang (a restarted
member): domains holding them are tried first, so the member rejoins its gang.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

Plan = dict[str, dict[str, int]]
"""job -> node -> members"""


class PlacementError(ValueError):
    """The gang cannot be placed as asked; the message says why."""


@dataclass(frozen=True)
class Candidate:
    """A node that can take members now: slots per Job and its topology labels."""

    name: str
    slots: Mapping[str, int]
    block: str | None = None
    switch: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Room:
    """Remaining room of one node, as a fraction used (jobs may ask for different pods)."""

    cand: Candidate
    used: float = 0.0

    def free(self, job: str) -> int:
        cap = self.cand.slots.get(job, 0)
        if cap <= 0:
            return 0
        return int(cap * (1.0 - self.used) + 1e-9)

    def take(self, job: str, n: int) -> None:
        self.used += n / self.cand.slots[job]


def _capacity(rooms: Sequence[_Room], jobs: Mapping[str, int]) -> int:
    """Members of the biggest Job that fit in these nodes (domain size for best fit)."""
    job = max(jobs, key=lambda j: (jobs[j], j))
    return sum(r.free(job) for r in rooms)


def _fill(rooms: Sequence[_Room], job: str, need: int, out: Plan) -> int:
    """Places up to `need` members of `job` on the nodes, fullest first; returns placed."""
    placed = 0
    for r in sorted(rooms, key=lambda r: (-r.used, r.free(job), r.cand.name)):
        if placed >= need:
            break
        n = min(r.free(job), need - placed)
        if n > 0:
            r.take(job, n)
            out.setdefault(job, {})[r.cand.name] = out.get(job, {}).get(r.cand.name, 0) + n
            placed += n
    return placed


def _group(rooms: Sequence[_Room], key: str) -> dict[str, list[_Room]]:
    out: dict[str, list[_Room]] = {}
    for r in rooms:
        value = r.cand.switch if key == "switch" else r.cand.block
        if value is None:
            continue
        if key == "switch":
            value = f"{r.cand.block or ''}/{value}"
        out.setdefault(value, []).append(r)
    return out


def _assign_jobs(rooms: Sequence[_Room], jobs: Mapping[str, int], anchors: Collection[str]) -> Plan:
    """Every Job on one switch when possible, else on the fewest switches; PlacementError if the
    nodes cannot hold them all."""
    out: Plan = {}
    switches = _group(rooms, "switch")
    loose = [r for r in rooms if r.cand.switch is None]
    for job in sorted(jobs, key=lambda j: (-jobs[j], j)):
        need = jobs[job]
        fits = [
            (not any(r.cand.name in anchors for r in rs), sum(r.free(job) for r in rs), name)
            for name, rs in switches.items()
            if sum(r.free(job) for r in rs) >= need
        ]
        if fits:
            _, _, name = min(fits)
            need -= _fill(switches[name], job, need, out)
        else:
            for name in sorted(switches, key=lambda s: -sum(r.free(job) for r in switches[s])):
                if need <= 0:
                    break
                need -= _fill(switches[name], job, need, out)
            if need > 0:
                need -= _fill(loose, job, need, out)
        if need > 0:
            raise PlacementError(f"no room for {need} member(s) of job {job or 'the gang'}")
    return out


def _best_domain(
    rooms: Sequence[_Room], key: str, jobs: Mapping[str, int], anchors: Collection[str]
) -> Plan | None:
    total = sum(jobs.values())
    domains = _group(rooms, key)
    order = sorted(
        (
            (not any(r.cand.name in anchors for r in rs), _capacity(rs, jobs), name)
            for name, rs in domains.items()
        ),
    )
    for _, cap, name in order:
        if cap < total:
            continue
        trial = [_Room(r.cand, r.used) for r in domains[name]]
        try:
            return _assign_jobs(trial, jobs, anchors)
        except PlacementError:
            continue
    return None


def _exclusive(
    rooms: Sequence[_Room], jobs: Mapping[str, int], key: str, busy: Collection[str]
) -> Plan:
    domains: dict[str, list[_Room]] = {}
    for r in rooms:
        value = r.cand.labels.get(key)
        if value is not None and value not in busy:
            domains.setdefault(value, []).append(r)
    out: Plan = {}
    taken: set[str] = set()
    for job in sorted(jobs, key=lambda j: (-jobs[j], j)):
        need = jobs[job]
        fits = sorted(
            (sum(r.free(job) for r in rs), name)
            for name, rs in domains.items()
            if name not in taken and sum(r.free(job) for r in rs) >= need
        )
        if not fits:
            raise PlacementError(
                f"exclusive topology {key}: no free domain left for job {job} "
                f"({need} member(s)); {len(domains)} domain(s) free of other jobs, "
                f"{len(taken)} taken by this gang"
            )
        _, name = fits[0]
        taken.add(name)
        _fill(domains[name], job, need, out)
    return out


def plan(
    candidates: Sequence[Candidate],
    jobs: Mapping[str, int],
    topology: bool,
    required: bool,
    exclusive_key: str | None = None,
    busy_domains: Collection[str] = (),
    anchors: Collection[str] = (),
) -> tuple[Plan, str]:
    """(plan, how it was placed); PlacementError naming the shortage when it cannot be."""
    jobs = {j: n for j, n in jobs.items() if n > 0}
    if not jobs:
        return {}, "nothing to place"
    total = sum(jobs.values())
    rooms = [_Room(c) for c in candidates if any(v > 0 for v in c.slots.values())]
    room_total = sum(r.free(max(jobs, key=lambda j: jobs[j])) for r in rooms)
    if exclusive_key:
        return _exclusive(rooms, jobs, exclusive_key, busy_domains), (
            f"one {exclusive_key} domain per job"
        )
    if not topology:
        try:
            return _assign_jobs(rooms, jobs, anchors), "without topology"
        except PlacementError:
            raise PlacementError(
                f"the free capacity holds {room_total} of the {total} member(s) still to place"
            ) from None
    for key in ("switch", "block"):
        found = _best_domain(rooms, key, jobs, anchors)
        if found is not None:
            return found, f"in one {key}"
    blocks = _group(rooms, "block")
    largest = max((_capacity(rs, jobs) for rs in blocks.values()), default=0)
    if required:
        raise PlacementError(
            f"topology required: no single block holds the {total} member(s) still to place "
            f"(the largest free block holds {largest}; {len(blocks)} block(s))"
        )
    # Preferred: the fewest blocks, largest first (nodes without a block label come last).
    ordered = sorted(blocks.items(), key=lambda kv: (-_capacity(kv[1], jobs), kv[0]))
    chosen: list[_Room] = []
    for _, rs in ordered:
        chosen.extend(rs)
        if _capacity(chosen, jobs) >= total:
            trial = [_Room(r.cand, r.used) for r in chosen]
            try:
                return _assign_jobs(
                    trial, jobs, anchors
                ), f"across {len(_group(chosen, 'block'))} blocks"
            except PlacementError:
                continue
    try:
        return _assign_jobs(rooms, jobs, anchors), "across all nodes"
    except PlacementError:
        raise PlacementError(
            f"the free capacity holds {room_total} of the {total} member(s) still to place"
        ) from None


def domains_used(p: Plan, by_name: Mapping[str, Candidate], key: str) -> set[str]:
    """The distinct domains (`block` or `switch`) a plan's nodes lie in (for tests, events)."""
    out: set[str] = set()
    for nodes in p.values():
        for n in nodes:
            c = by_name[n]
            out.add(f"{c.block}/{c.switch}" if key == "switch" else str(c.block))
    return out
