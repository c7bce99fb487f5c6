"""The scheduler cache: nodes and the pods on them (bound and assumed), with indexes.

Fed by the node and pod watches; the scheduling cycle assumes a pod (and
reserves its devices) before binding, so the next cycle already sees the
devices as taken. Device holdings of bound pods come from their annotations
(what the Device Plugin recorded wins over what a scheduler assigned), so a
restarted scheduler rebuilds exactly the accounting it had.

Every method takes the cache lock; the scheduling cycle holds it for the
whole cycle (`with cache.lock:`) so that it sees one consistent state.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from lj_runtimekit.proto.pkg.protocol import (
    BIND_PHASE_ALLOCATED,
    AssignmentError,
    DeviceShare,
    PodAssignment,
    Protocol,
    decode_assignment,
    encode_assignment,
    pod_shares,
)
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import (
    NodeInfo,
    NodeOwnership,
    Taint,
    whole_kinds,
)
from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    KubeObject,
    PodInfo,
)
from lj_runtimekit.schedulerframework.internal.dra.state import DraState

log = logging.getLogger(__name__)


def held_shares(pod: PodInfo, assignment: PodAssignment) -> tuple[DeviceShare, ...]:
    """What the pod holds on its node: its init containers' devices overlap its other
    containers' (the kubelet hands them over), so they are counted once (`pod_shares`)."""
    return pod_shares(assignment, [(c.name, c.sidecar) for c in pod.containers if c.init])


class RankedBuckets:
    """Node names grouped by a number (free devices, free core %), listed in rank order.

    Each bucket keeps its names sorted, a name moving by bisection: a scheduling cycle
    lists the ranked nodes, and between two cycles only a node or two move, so listing
    costs a copy per bucket and never a sort (sorting a bucket of thousands of nodes
    again each cycle was most of a cycle at 5000 nodes).
    """

    def __init__(self) -> None:
        self._buckets: dict[int, list[str]] = {}

    def move(self, name: str, old: int | None, new: int | None) -> None:
        """`name` leaves bucket `old` and joins bucket `new` (None: none)."""
        if old is not None:
            bucket = self._buckets.get(old)
            if bucket is not None:
                i = bisect_left(bucket, name)
                if i < len(bucket) and bucket[i] == name:
                    del bucket[i]
                if not bucket:
                    del self._buckets[old]
        if new is not None:
            bucket = self._buckets.setdefault(new, [])
            i = bisect_left(bucket, name)
            if i == len(bucket) or bucket[i] != name:
                bucket.insert(i, name)

    def ranked(self, at_least: int, ascending: bool) -> list[str]:
        """Names in buckets >= `at_least`, smallest (or largest) bucket first, by name within."""
        out: list[str] = []
        for value in sorted(self._buckets, reverse=not ascending):
            if value >= at_least:
                out.extend(self._buckets[value])
        return out


@dataclass
class PodState:
    pod: PodInfo
    node: str
    assumed: bool
    devices_text: str | None = None
    """The assignment annotation the device holdings were built from."""


class Cache:
    """Nodes, assigned/assumed pods, device holdings, and indexes over free devices."""

    def __init__(self, protocol: Protocol) -> None:
        self.lock = threading.RLock()
        self.protocol = protocol
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodState] = {}
        self.kinds = tuple(dict.fromkeys(whole_kinds(protocol).values()))
        # kind -> node names by free whole device count
        self.free_index: dict[str, RankedBuckets] = {k: RankedBuckets() for k in self.kinds}
        self._free_of: dict[str, dict[str, int]] = {k: {} for k in self.kinds}
        self._capacity_of: dict[str, dict[str, int]] = {k: {} for k in self.kinds}
        self._capacity_count: dict[str, Counter[int]] = {k: Counter() for k in self.kinds}
        self.mig_nodes: dict[str, set[str]] = {}
        self._mig_of: dict[str, dict[str, int]] = {}
        self.slice_nodes: set[str] = set()
        self.soft_tainted: set[str] = set()
        """Nodes with a PreferNoSchedule taint (TaintToleration scores only when there are)."""
        self.hard_tainted: dict[tuple[Taint, ...], set[str]] = {}
        """Nodes with NoSchedule or NoExecute taints, grouped by those taints: TaintToleration
        judges a group once per cycle (a zone's unreachable nodes share one group)."""
        self._hard_taints_of: dict[str, tuple[Taint, ...]] = {}
        # node names by the most free core % on one sliceable GPU of the node
        self.slice_room = RankedBuckets()
        self._slice_room_of: dict[str, int] = {}
        self.generation = 0
        """Bumped on every change of a node or a pod."""
        self.node_generation = 0
        """Bumped on every change of a node (labels, taints, allocatable, devices), or removal."""
        self.ownership: NodeOwnership | None = None
        self._foreign: set[str] = set()
        """Nodes another scheduler owns (NodeOwnership)."""
        self.dra_nodes: set[str] = set()
        """Nodes serving their devices through DRA (NodeInfo.dra): they offer no device."""
        self.dra = DraState()
        """The driver's ResourceSlices, DeviceClasses, ResourceClaims and their allocations."""
        self._shared_warned: set[str] = set()

    def devices_changed(self) -> None:
        """DRA devices came, went, or were allocated or freed: what was planned on the nodes
        as they were may change (a gang's unmet plan is made again)."""
        with self.lock:
            self.generation += 1
            self.node_generation += 1

    def set_ownership(self, ownership: NodeOwnership | None) -> None:
        """Which nodes this process may place pods on (one owner per node)."""
        with self.lock:
            self.ownership = ownership
            for node in list(self.nodes.values()):
                if node.present:
                    self.update_node(node.obj)

    # -- indexes --------------------------------------------------------------------------

    def _reindex(self, node: NodeInfo) -> None:
        name = node.name
        present = node.present
        # A node another scheduler owns offers no device (NodeInfo.foreign) but is indexed
        # as if all free: PreFilter keeps it, so its Filter (the owner taint) says why not.
        foreign = node.devices.devices if present and node.foreign else None
        if foreign is not None:
            self._foreign.add(name)
        else:
            self._foreign.discard(name)
        for kind in self.kinds:
            if foreign is not None:
                free = sum(1 for d in foreign if d.kind == kind and d.mode != "mig")
                cap = free
            else:
                free = node.devices.free_whole_count(kind) if present else 0
                cap = node.devices.whole_capacity(kind) if present else 0
            old = self._free_of[kind].get(name)
            if old != free:
                self.free_index[kind].move(name, old, free)
                self._free_of[kind][name] = free
            old_cap = self._capacity_of[kind].get(name)
            if old_cap != cap:
                if old_cap is not None:
                    self._capacity_count[kind][old_cap] -= 1
                    if not self._capacity_count[kind][old_cap]:
                        del self._capacity_count[kind][old_cap]
                self._capacity_of[kind][name] = cap
                self._capacity_count[kind][cap] += 1
        if present and node.dra:
            self.dra_nodes.add(name)
        else:
            self.dra_nodes.discard(name)
        if present and node.soft_taints:
            self.soft_tainted.add(name)
        else:
            self.soft_tainted.discard(name)
        self._group_hard_taints(name, node.taints if present else ())
        if present and any(
            d.mode == "tdm" and (d.healthy or foreign is not None) for d in node.devices.devices
        ):
            self.slice_nodes.add(name)
        else:
            self.slice_nodes.discard(name)
        room = -1
        if foreign is not None:
            room = 100 if any(d.kind == "gpu" and d.mode == "tdm" for d in foreign) else -1
        elif present:
            for d in node.devices.devices:
                if d.kind == "gpu" and d.sliceable and d.core_free > room:
                    room = d.core_free
        old_room = self._slice_room_of.get(name)
        if old_room != room:
            self.slice_room.move(name, old_room, room)
            self._slice_room_of[name] = room
        migs: dict[str, int] = {}
        if foreign is not None:
            for d in foreign:
                for prof in d.mig_profiles.values() if d.mode == "mig" else ():
                    migs[prof] = migs.get(prof, 0) + 1
        elif present:
            migs = node.devices.mig_capacity()
        old_migs = self._mig_of.get(name, {})
        if migs != old_migs:
            for prof in old_migs:
                self.mig_nodes.get(prof, set()).discard(name)
            for prof in migs:
                self.mig_nodes.setdefault(prof, set()).add(name)
            self._mig_of[name] = migs

    def _drop_index(self, name: str) -> None:
        for kind in self.kinds:
            self.free_index[kind].move(name, self._free_of[kind].pop(name, None), None)
            old_cap = self._capacity_of[kind].pop(name, None)
            if old_cap is not None:
                self._capacity_count[kind][old_cap] -= 1
                if not self._capacity_count[kind][old_cap]:
                    del self._capacity_count[kind][old_cap]
        self.slice_nodes.discard(name)
        self.soft_tainted.discard(name)
        self._group_hard_taints(name, ())
        self._foreign.discard(name)
        self.dra_nodes.discard(name)
        self.slice_room.move(name, self._slice_room_of.pop(name, None), None)
        for prof in self._mig_of.pop(name, {}):
            self.mig_nodes.get(prof, set()).discard(name)

    def _group_hard_taints(self, name: str, taints: tuple[Taint, ...]) -> None:
        old = self._hard_taints_of.get(name, ())
        if taints == old:
            return
        if old:
            group = self.hard_tainted[old]
            group.discard(name)
            if not group:
                del self.hard_tainted[old]
        if taints:
            self.hard_tainted.setdefault(taints, set()).add(name)
            self._hard_taints_of[name] = taints
        else:
            del self._hard_taints_of[name]

    def max_whole_capacity(self, kind: str) -> int:
        """The most whole devices of `kind` any node has (healthy, not in MIG mode)."""
        counts = self._capacity_count.get(kind)
        return max(counts) if counts else 0

    def nodes_with_free(self, kind: str, at_least: int, ascending: bool) -> list[str]:
        """Nodes with at least `at_least` free whole devices, fewest (or most) free first."""
        index = self.free_index.get(kind)
        return index.ranked(at_least, ascending) if index is not None else []

    def nodes_with_slice_room(self, core: int, ascending: bool) -> list[str]:
        """Nodes with a sliceable GPU with `core` % free or more, tightest (roomiest) first."""
        return self.slice_room.ranked(max(core, 0), ascending)

    def free_whole(self, kind: str, node: str) -> int:
        if node in self._foreign:
            return 0
        return self._free_of.get(kind, {}).get(node, 0)

    # -- nodes ----------------------------------------------------------------------------

    def update_node(self, obj: KubeObject) -> NodeInfo:
        with self.lock:
            name = str((obj.get("metadata") or {}).get("name", ""))
            node = self.nodes.get(name)
            if node is None:
                node = self.nodes[name] = NodeInfo(name)
            node.update(obj, self.protocol, self.ownership)
            self._reindex(node)
            self.generation += 1
            self.node_generation += 1
            return node

    def remove_node(self, name: str) -> None:
        with self.lock:
            node = self.nodes.get(name)
            if node is None:
                return
            if node.pods:
                node.obj = {}  # keep the pods' accounting until they are deleted
                self._reindex(node)
            else:
                del self.nodes[name]
                self._drop_index(name)
            self.generation += 1
            self.node_generation += 1

    def node_infos(self) -> Iterator[NodeInfo]:
        return (n for n in self.nodes.values() if n.present)

    def node_count(self) -> int:
        return sum(1 for n in self.nodes.values() if n.present)

    def _node(self, name: str) -> NodeInfo:
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = NodeInfo(name)
        return node

    # -- pods -----------------------------------------------------------------------------

    def _devices_text(self, pod: PodInfo) -> str | None:
        """The devices the pod holds, as assignment text: the Device Plugin's record once
        the pod's admission is settled; before that (part-way through admission, or
        rejected after a first container) the recorded containers override their assignment
        and the others keep their assigned devices, which the kubelet may still hand out."""
        ann = pod.annotations
        a = self.protocol.annotations
        allocated, assigned = ann.get(a.allocated_devices), ann.get(a.assigned_devices)
        if not allocated or not assigned or ann.get(a.bind_phase) == BIND_PHASE_ALLOCATED:
            return allocated or assigned
        try:
            merged = {**decode_assignment(assigned), **decode_assignment(allocated)}
        except AssignmentError:
            return allocated  # reported as unreadable when applied
        return encode_assignment(merged)

    def _check_shared(self, pod: PodInfo) -> None:
        """Warns once per node when another lj-scheduler process placed device pods on a node
        this one may place on too (no owner label): the two can overcommit its devices."""
        o = self.ownership
        node = self.nodes.get(pod.node_name)
        if o is None or node is None or not node.present or node.foreign:
            return
        if pod.scheduler_name in o.profiles or node.name in self._shared_warned:
            return
        if o.label in node.labels:
            return
        self._shared_warned.add(node.name)
        log.warning(
            "node %s has device pods placed by scheduler %s (pod %s) and no owner label %s: "
            "two scheduler processes placing on one node can give out the same device; label "
            "it %s=<scheduler name> (or set requireNodeOwner)",
            node.name,
            pod.scheduler_name,
            pod.key,
            o.label,
            o.label,
            extra={"node": node.name},
        )

    def _place(self, state: PodState) -> None:
        node = self._node(state.node)
        node.pods.add(state.pod.uid)
        node.add_requests(state.pod.requests, +1)

    def _unplace(self, state: PodState) -> None:
        node = self.nodes.get(state.node)
        if node is None:
            return
        node.pods.discard(state.pod.uid)
        node.add_requests(state.pod.requests, -1)
        node.devices.release(state.pod.uid)
        if not node.present and not node.pods:
            del self.nodes[state.node]
            self._drop_index(state.node)
        else:
            self._reindex(node)

    def _apply_devices(self, state: PodState, text: str | None) -> None:
        node = self.nodes[state.node]
        node.devices.release(state.pod.uid)
        state.devices_text = text
        if text:
            try:
                shares = held_shares(state.pod, decode_assignment(text))
            except AssignmentError as exc:
                log.warning(
                    "pod device annotation unreadable, devices not accounted: %s",
                    exc,
                    extra={"pod": state.pod.key, "node": state.node},
                )
                shares = ()
            node.devices.apply(state.pod.uid, shares)
        self._reindex(node)

    def update_pod(self, pod: PodInfo) -> bool:
        """A pod assigned to a node (bound, or seen bound after a restart). True when the
        devices it holds on a node it was already accounted on changed (some may be free)."""
        with self.lock:
            self.generation += 1
            if pod.terminal:
                self.remove_pod(pod.uid)
                return False
            state = self.pods.get(pod.uid)
            text = self._devices_text(pod)
            if state is not None and state.node == pod.node_name:
                if state.assumed:
                    state.assumed = False  # confirmed by the watch
                    node = self.nodes[state.node]
                    node.add_requests(state.pod.requests, -1)
                    node.add_requests(pod.requests, +1)
                    state.pod = pod
                    if text and text != state.devices_text:
                        self._apply_devices(state, text)
                    return False
                if pod.requests != state.pod.requests:  # in-place resize
                    self.nodes[state.node].add_requests(state.pod.requests, -1)
                    self.nodes[state.node].add_requests(pod.requests, +1)
                state.pod = pod
                if text != state.devices_text:
                    self._apply_devices(state, text)
                    return True
                return False
            if state is not None:
                self._unplace(state)
            state = PodState(pod, pod.node_name, assumed=False)
            self.pods[pod.uid] = state
            self._place(state)
            self._apply_devices(state, text)
            if text:
                self._check_shared(pod)
            return False

    def remove_pod(self, uid: str) -> None:
        with self.lock:
            state = self.pods.pop(uid, None)
            if state is not None:
                self._unplace(state)
                self.generation += 1

    def assume_pod(self, pod: PodInfo, node_name: str) -> None:
        """Account a pod on a node before its binding is confirmed. ValueError when the
        pod is confirmed bound: replacing that entry would free the devices it holds."""
        with self.lock:
            old = self.pods.get(pod.uid)
            if old is not None and not old.assumed:
                raise ValueError(f"pod {pod.key} is bound to node {old.node}: not assumed again")
            if old is not None:
                self._unplace(old)
            state = PodState(pod, node_name, assumed=True)
            self.pods[pod.uid] = state
            self._place(state)
            self.generation += 1

    def forget_pod(self, uid: str) -> None:
        """Undo `assume_pod` (and any devices reserved) after a failed bind or a rejection."""
        with self.lock:
            state = self.pods.get(uid)
            if state is not None and state.assumed:
                del self.pods[uid]
                self._unplace(state)
                self.generation += 1

    def is_assumed(self, uid: str) -> bool:
        with self.lock:
            state = self.pods.get(uid)
            return state is not None and state.assumed

    def reserve_devices(self, uid: str, node_name: str, shares: tuple[DeviceShare, ...]) -> None:
        with self.lock:
            node = self._node(node_name)
            node.devices.apply(uid, shares)
            state = self.pods.get(uid)
            if state is not None:
                state.devices_text = None
            self._reindex(node)

    def release_devices(self, uid: str, node_name: str) -> None:
        with self.lock:
            node = self.nodes.get(node_name)
            if node is not None:
                node.devices.release(uid)
                self._reindex(node)

    def mark_devices_text(self, uid: str, text: str) -> None:
        """The annotation text that matches the devices reserved for an assumed pod."""
        with self.lock:
            state = self.pods.get(uid)
            if state is not None:
                state.devices_text = text

    # -- checks ---------------------------------------------------------------------------

    def violations(self) -> list[str]:
        """Every breach of the device sharing invariant, prefixed by the node."""
        with self.lock:
            return [
                f"node {n.name}: {v}" for n in self.nodes.values() for v in n.devices.violations()
            ]
