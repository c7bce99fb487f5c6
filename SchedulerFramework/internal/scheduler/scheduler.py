"""The scheduler: one scheduling loop, a bounded pool of binding workers, Permit waits.

Threads, not asyncio: the kubernetes client is synchronous, the cycle is
CPU-bound Python, and the upstream shape (one scheduling goroutine, binding
goroutines) maps one to one onto one scheduling thread plus a bounded
ThreadPoolExecutor; see the README.
"""

from __future__ import annotations

import copy
import heapq
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.proto.pkg.kube import KubeClient, KubeError
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.schedulerframework.internal.cache.cache import Cache
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import (
    KubeObject,
    PodInfo,
    parse_pod,
)
from lj_runtimekit.schedulerframework.internal.config.config import Config
from lj_runtimekit.schedulerframework.internal.dra.objects import Claim, uses_claim
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    PodEventPlugin,
    QueueingHintPlugin,
    WaitingPod,
)
from lj_runtimekit.schedulerframework.internal.framework.runtime import (
    Diagnosis,
    EnabledPlugin,
    Framework,
)
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    UNKNOWN_OUTCOME_STATUSES,
    ClusterEvent,
    Code,
    CycleState,
    Status,
    error,
    nodes_unavailable,
    unresolvable,
)
from lj_runtimekit.schedulerframework.internal.plugins.registry import REGISTRY
from lj_runtimekit.schedulerframework.internal.queue.queue import QueuedPod, SchedulingQueue
from lj_runtimekit.schedulerframework.internal.scheduler import metrics
from lj_runtimekit.schedulerframework.internal.scheduler.admission import (
    AdmissionGate,
    in_admission,
)
from lj_runtimekit.schedulerframework.internal.scheduler.conditions import (
    SCHEDULER_ERROR,
    UNSCHEDULABLE,
    ConditionWriter,
)
from lj_runtimekit.schedulerframework.internal.scheduler.events import EventRecorder
from lj_runtimekit.schedulerframework.internal.scheduler.preemption import (
    Evictor,
    Nominator,
    Preemption,
)

log = logging.getLogger(__name__)

ASSUMED_EXPIRY_S = 60.0
"""How long a pod whose Binding got no answer stays assumed when the watch never shows it
bound (kube-scheduler's assumed-pod expiry; the API server gives up on a request after 60 s)."""
"""No answer, or the server's own timeout: the Binding may still have been written."""


def binding_body(
    namespace: str, name: str, uid: str, node_name: str, annotations: Mapping[str, str]
) -> dict[str, object]:
    """The Binding of pod `namespace/name` (`uid`) to `node_name`, carrying `annotations`
    onto the pod (the API server copies a Binding's annotations)."""
    meta: dict[str, object] = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
    }


def failure_message(total_nodes: int, diagnosis: Diagnosis) -> str:
    """Upstream's FitError text: "0/N nodes are available: 3 reason, 5 reason."."""
    post = diagnosis.postfilter
    preemption = f" preemption: {post.message()}" if post is not None and post.reasons else ""
    if diagnosis.prefilter is not None:
        return f"0/{total_nodes} nodes are available: {diagnosis.prefilter.message()}.{preemption}"
    histogram: Counter[str] = Counter()
    for status in diagnosis.statuses.values():
        for reason in status.reasons or (f"rejected by plugin {status.plugin}",):
            histogram[reason] += 1
    if diagnosis.excluded:
        histogram[diagnosis.excluded_reason or "node(s) were ruled out at PreFilter"] += (
            diagnosis.excluded
        )
    return nodes_unavailable(total_nodes, histogram) + preemption


def rejecting_plugins(diagnosis: Diagnosis) -> frozenset[str]:
    """The plugins that turned the pod away on some node (empty: not known by name)."""
    names = {s.plugin for s in diagnosis.statuses.values()}
    if diagnosis.prefilter is not None:
        names.add(diagnosis.prefilter.plugin)
    if diagnosis.excluded:
        names.update(diagnosis.excluded_by)
    return frozenset() if "" in names else frozenset(names)


_NODE_FIELDS = (
    ClusterEvent.NODE_LABEL,
    ClusterEvent.NODE_ALLOCATABLE,
    ClusterEvent.NODE_TAINT,
    ClusterEvent.NODE_TAINT,
    ClusterEvent.NODE_ALLOCATABLE,
)
"""The event for each part of a node's signature (labels, device inventory, taints,
unschedulable, allocatable)."""


def node_events(old: tuple[object, ...] | None, new: tuple[object, ...]) -> list[str]:
    """The ClusterEvents of a node update, from its old and new signatures."""
    if old is None:
        return [ClusterEvent.NODE_ADD]
    changed = (e for e, a, b in zip(_NODE_FIELDS, old, new, strict=True) if a != b)
    return list(dict.fromkeys(changed))


@dataclass
class _Binding:
    framework: Framework
    state: CycleState
    queued: QueuedPod
    node: str
    slot: bool = False
    """Holds one of the bounded bind slots (the scheduling loop's backpressure)."""


class _Timers:
    """One thread running callbacks at deadlines (Permit timeouts): a gang of hundreds of
    waiting pods costs a heap entry each, not a thread each."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._seq = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, delay_s: float, fn: Callable[[], None]) -> int:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (time.monotonic() + delay_s, self._seq, fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="permit-timers", daemon=True)
                self._thread.start()
            self._cond.notify()
            return self._seq

    def cancel(self, token: int) -> None:
        with self._cond:
            self._cancelled.add(token)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][1] in self._cancelled:
                        self._cancelled.discard(heapq.heappop(self._heap)[1])
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, fn = heapq.heappop(self._heap)
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            try:
                fn()
            except Exception:
                log.exception("permit timer callback failed")


class _WaitingPod:
    """A reserved pod held at Permit until every waiting plugin allows it."""

    def __init__(
        self, scheduler: Scheduler, binding: _Binding, plugins: Mapping[str, float]
    ) -> None:
        self._scheduler = scheduler
        self.binding = binding
        self._pending = set(plugins)
        self._lock = threading.Lock()
        self._done = False
        self._timeout_s = min(plugins.values()) if plugins else 0.0
        self._timer = 0

    @property
    def pod(self) -> PodInfo:
        return self.binding.queued.pod

    @property
    def node_name(self) -> str:
        return self.binding.node

    def pending_plugins(self) -> list[str]:
        with self._lock:
            return sorted(self._pending)

    def start(self) -> None:
        self._timer = self._scheduler._timers.add(self._timeout_s, self._timeout)

    def allow(self, plugin: str) -> None:
        with self._lock:
            if self._done:
                return
            self._pending.discard(plugin)
            if self._pending:
                return
            self._done = True
        self._scheduler._timers.cancel(self._timer)
        self._scheduler._waiting_done(self, None)

    def reject(self, plugin: str, message: str) -> None:
        # Under the cache lock, as a scheduling cycle runs: a rejection (a Permit timer, a
        # deletion) comes either before the cycle in which a plugin allows the pod, and that
        # cycle sees it released, or after it, and finds the pod allowed.
        with self._scheduler.cache.lock:
            with self._lock:
                if self._done:
                    return
                self._done = True
            self._scheduler._timers.cancel(self._timer)
            self._scheduler._waiting_done(self, Status(Code.UNSCHEDULABLE, (message,), plugin))

    def _timeout(self) -> None:
        self.reject(
            ",".join(self.pending_plugins()) or "Permit", "rejected due to timeout at Permit"
        )


class Scheduler:
    """Implements the framework Handle; owns the cache, the queue and the profiles."""

    def __init__(
        self,
        config: Config,
        protocol: Protocol,
        kube: KubeClient | None,
        recorder: EventRecorder | None = None,
    ) -> None:
        self.config = config
        self._protocol = protocol
        self.kube = kube
        self._cache = Cache(protocol)
        self.queue = SchedulingQueue(config.pod_initial_backoff_s, config.pod_max_backoff_s)
        self.recorder = recorder or EventRecorder(None, "lj-scheduler", "test")
        self.conditions = ConditionWriter(kube)
        """PodScheduled=False on the pods that cannot be placed"""
        self.nominator = Nominator(self._cache)
        self.evictor = Evictor(kube, self.event, self.nominator.drop_victims)
        self.frameworks: dict[str, Framework] = {}
        for profile in config.profiles:
            plugins = [
                EnabledPlugin(REGISTRY[s.name].factory(s.args, self), s.weight)
                for s in profile.plugins
            ]
            self.frameworks[profile.scheduler_name] = Framework(
                profile.scheduler_name, plugins, self, config.percentage_of_nodes_to_score
            )
        self._hints: dict[str, QueueingHintPlugin] = {}
        """plugin name -> its queueing hint for node events"""
        for fwk in self.frameworks.values():
            self.queue.events_of.update(fwk.events_of())
            self._hints.update(
                (p.name, p) for p in fwk.plugins if isinstance(p, QueueingHintPlugin)
            )
        self._pool = ThreadPoolExecutor(config.bind_workers, thread_name_prefix="bind")
        self._bind_slots = threading.BoundedSemaphore(config.bind_workers * 4)
        self._binds_in_flight = 0
        self._idle = threading.Condition()
        self._waiting: dict[str, _WaitingPod] = {}
        self.admission: AdmissionGate[Callable[[], None]] = AdmissionGate()
        self._timers = _Timers()
        self._waiting_lock = threading.Lock()
        self._node_signatures: dict[str, tuple[object, ...]] = {}
        self._after_cycle: list[Callable[[], None]] = []
        """run by the scheduling thread once its cycle has let the cache lock go"""
        self._cycle_thread: int | None = None
        """the thread running a scheduling cycle, while it does"""
        self._pod_listeners = [
            p for f in self.frameworks.values() for p in f.plugins if isinstance(p, PodEventPlugin)
        ]
        self.bound = 0
        self.bind_failures = 0
        self.assumed_expiry_s = ASSUMED_EXPIRY_S
        self._stopping = False

    # -- Handle ---------------------------------------------------------------------------

    @property
    def cache(self) -> Cache:
        return self._cache

    @property
    def protocol(self) -> Protocol:
        return self._protocol

    def iterate_waiting_pods(self) -> Iterator[WaitingPod]:
        with self._waiting_lock:
            return iter(list(self._waiting.values()))

    def get_waiting_pod(self, uid: str) -> WaitingPod | None:
        with self._waiting_lock:
            return self._waiting.get(uid)

    def event(self, pod: PodInfo, kind: str, reason: str, message: str) -> None:
        self.recorder.event(pod, kind, reason, message)

    def activate(self, uids: Iterable[str]) -> None:
        self.queue.activate(uids)

    def move_to_active_or_backoff(self, uids: Iterable[str]) -> None:
        self.queue.move_to_active_or_backoff(uids)

    def _run_after_cycle(self) -> None:
        while self._after_cycle:
            fn = self._after_cycle.pop(0)
            try:
                fn()
            except Exception:
                log.exception("after-cycle hook failed")

    def filter_nodes(
        self,
        pod: PodInfo,
        skip: str,
        only: Collection[str] | None = None,
        beside: Sequence[PodInfo] = (),
    ) -> list[NodeInfo]:
        fwk = self.frameworks.get(pod.scheduler_name)
        if fwk is None or pod.parse_errors:
            return []
        state = CycleState()
        with self._cache.lock:
            pre, status = fwk.run_pre_filter(state, pod, skip)
            if not status.ok:
                return []
            nodes = self._cache.nodes
            names: Iterable[str] = nodes if pre is None else pre.node_names
            if only is not None:
                names = [x for x in names if x in only]
            candidates = [
                n
                for n in (nodes.get(x) for x in names)
                if n is not None and n.present and state.ruled_out_status(n.name) is None
            ]
            nominated = self.nominator.by_node
            return [
                n
                for n in candidates
                if fwk.run_filters_with_nominated(
                    state,
                    pod,
                    n,
                    [*nominated.get(n.name, ()), *beside] if beside else nominated.get(n.name, ()),
                    skip,
                ).ok
            ]

    def filter_status(self, pod: PodInfo, node_name: str) -> Status:
        fwk = self.frameworks.get(pod.scheduler_name)
        if pod.parse_errors:
            return unresolvable(*pod.parse_errors)
        if fwk is None:
            return unresolvable(f"no profile {pod.scheduler_name}")
        state = CycleState()
        with self._cache.lock:
            node = self._cache.nodes.get(node_name)
            if node is None or not node.present:
                return unresolvable(f"node {node_name} not found")
            pre, status = fwk.run_pre_filter(state, pod)
            if not status.ok:
                return status
            return fwk.node_status(state, pod, pre, node, self.nominator.by_node.get(node_name, ()))

    def nominations(self) -> Mapping[str, Sequence[PodInfo]]:
        return self.nominator.by_node

    def preempt(self, pod: PodInfo, node_name: str, victims: Sequence[PodInfo]) -> None:
        self.nominator.add(pod, node_name, [v.uid for v in victims])
        metrics.PREEMPTIONS.inc()
        metrics.PREEMPTION_VICTIMS.observe(len(victims))
        names = ", ".join(v.key for v in victims)
        self.event(
            pod,
            "Normal",
            "Preempting",
            f"Preempting {len(victims)} lower-priority pod(s) on node {node_name}: {names}",
        )
        self.evictor.submit(Preemption(pod, node_name, tuple(victims)))

    def preemption_pending(self, pod: PodInfo) -> str | None:
        return self.nominator.waiting(pod)

    def get_json(self, path: str) -> dict[str, Any] | None:
        if self.kube is None:
            return None
        try:
            return self.kube.request("GET", path, timeout_s=10)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def write_json(self, method: str, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.kube is None:
            raise KubeError(f"{method} {path}", 0, "no API client")
        return self.kube.request(method, path, body=body, timeout_s=10)

    def bind_pod(self, pod: PodInfo, node_name: str, annotations: Mapping[str, str]) -> Status:
        if self.kube is None:
            return error("no API client")
        body = binding_body(pod.namespace, pod.name, pod.uid, node_name, annotations)
        try:
            self.kube.request(
                "POST", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding", body=body
            )
        except KubeError as exc:
            unknown = exc.status in UNKNOWN_OUTCOME_STATUSES
            return Status(Code.ERROR, (exc.message,), "DefaultBinder", unknown)
        return SUCCESS

    # -- informer handlers ----------------------------------------------------------------

    def on_node(self, etype: str, obj: KubeObject) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if etype == "DELETED":
            self._cache.remove_node(name)
            self._node_signatures.pop(name, None)
            return
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        signature = (
            meta.get("labels"),
            (meta.get("annotations") or {}).get(self._protocol.annotations.node_devices),
            spec.get("taints"),
            spec.get("unschedulable"),
            (obj.get("status") or {}).get("allocatable"),
        )
        old = self._node_signatures.get(name)
        if old == signature:
            return  # a heartbeat: nothing the scheduler looks at changed
        self._node_signatures[name] = signature
        live = self._cache.nodes.get(name)
        before = copy.copy(live) if live is not None and live.present else None
        node = self._cache.update_node(obj)
        events = node_events(old, signature)
        if before is not None and before.foreign != node.foreign:  # its owner changed
            events += [ClusterEvent.NODE_TAINT, ClusterEvent.NODE_ALLOCATABLE]
        if before is not None and before.dra != node.dra:  # its devices came or went
            events.append(ClusterEvent.NODE_ALLOCATABLE)

        def hint(pod: PodInfo, plugin: str) -> bool:
            h = self._hints.get(plugin)
            return h is None or h.queueing_hint(pod, before, node)

        for event in dict.fromkeys(events):
            self._cluster_event(event, hint)

    def on_resource_slice(self, etype: str, obj: KubeObject) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._cache.lock:
            if etype == "DELETED":
                self._cache.dra.remove_slice(name)
            else:
                self._cache.dra.update_slice(obj)
            self._cache.devices_changed()
        self._cluster_event(ClusterEvent.RESOURCE_SLICE)

    def on_resource_claim(self, etype: str, obj: KubeObject) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        with self._cache.lock:
            dra = self._cache.dra
            before = dra.claims.get(key)
            after: Claim | None = None
            if etype == "DELETED":
                dra.remove_claim(key)
            else:
                after = dra.update_claim(obj)
            held = before.allocation if before else None
            now = after.allocation if after else None
            if held != now:
                self._cache.devices_changed()  # devices held or freed
            else:
                self._cache.generation += 1  # e.g. a claim made for a pod from its template
        if after is None or (held is not None and held != now):
            self._cluster_event(ClusterEvent.RESOURCE_CLAIM)  # gone, or its devices freed
            return
        claim = after

        def uses(pod: PodInfo, _plugin: str) -> bool:
            # as upstream's queueing hint: a claim made, allocated or reserved matters to
            # the pods that use it alone (a gang's members waiting for the others' claims
            # are woken by the gang once the last one is there)
            return uses_claim(pod.obj, claim)

        self._cluster_event(ClusterEvent.RESOURCE_CLAIM, uses)

    def on_device_class(self, etype: str, obj: KubeObject) -> None:
        with self._cache.lock:
            if etype == "DELETED":
                self._cache.dra.remove_class(str((obj.get("metadata") or {}).get("name", "")))
            else:
                self._cache.dra.update_class(obj)
        self._cluster_event(ClusterEvent.DEVICE_CLASS)

    def _cluster_event(
        self, event: str, hint: Callable[[PodInfo, str], bool] | None = None
    ) -> None:
        moved = self.queue.move_for_event(event, hint)
        log.debug("cluster event %s moved %d unschedulable pod(s)", event, moved)

    def on_pod(self, etype: str, obj: KubeObject) -> None:
        self._follow_admission(etype, obj)
        if etype != "DELETED" and self._unchanged_bound_pod(obj):
            return  # e.g. a status update of a running pod: nothing to account
        pod = parse_pod(obj)
        if self._pod_listeners and pod.scheduler_name in self.frameworks:
            for listener in self._pod_listeners:
                listener.on_pod_event(etype, pod)
        if etype == "DELETED":
            self.queue.delete(pod.uid)
            self.nominator.remove(pod.uid)
            waiting = self.get_waiting_pod(pod.uid)
            if waiting is not None:
                waiting.reject("", "pod deleted")
            if pod.uid in self._cache.pods:
                self._cache.remove_pod(pod.uid)
                self._cluster_event(ClusterEvent.POD_DELETE)
                self._victim_gone(pod.uid)
            return
        if pod.node_name:
            self.queue.delete(pod.uid)
            self.nominator.remove(pod.uid)
            was_terminal = pod.terminal and pod.uid in self._cache.pods
            devices_changed = self._cache.update_pod(pod)
            if was_terminal:
                self._cluster_event(ClusterEvent.POD_DELETE)
                self._victim_gone(pod.uid)
            elif devices_changed:
                self._cluster_event(ClusterEvent.POD_DEVICES)
            return
        if pod.deleting:
            self.queue.delete(pod.uid)  # never scheduled again, whatever its attempt is doing
            self.nominator.remove(pod.uid)
            return
        if pod.terminal or pod.scheduler_name not in self.frameworks:
            return
        if pod.gated:  # upstream's SchedulingGates PreEnqueue: not tried until they are gone
            self.queue.delete(pod.uid)
            return
        self.nominator.update(pod)
        if pod.uid in self._cache.pods:
            return  # assumed: its binding is in flight
        self.queue.add(pod)

    def _victim_gone(self, uid: str) -> None:
        """The last victim of a preemption went: its pod is tried now, not after its backoff
        (what it waited for is there)."""
        preemptor = self.nominator.victim_gone(uid)
        if preemptor is not None:
            self.queue.activate([preemptor])

    def _follow_admission(self, etype: str, obj: KubeObject) -> None:
        """Open a node again once its device pod's admission is settled (or the pod gone);
        note pods in admission bound before this process started."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        a = self._protocol.annotations
        if etype != "DELETED" and in_admission(obj, a.assigned_devices, a.bind_phase):
            node = str((obj.get("spec") or {}).get("nodeName"))
            if self._serial_admission(node):
                self.admission.hold(node, uid)
            return
        # A pod deleted while its binding waits for the node is bound after all and fails
        # there ("not found"), which frees the node for the next one.
        self._admitted(uid)

    def _admitted(self, uid: str) -> None:
        """`uid` left admission: bind the next device pod waiting for its node."""
        following = self.admission.leave(uid)
        if following is not None:
            following()

    def _unchanged_bound_pod(self, obj: KubeObject) -> bool:
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            return False
        meta = obj.get("metadata") or {}
        state = self._cache.pods.get(str(meta.get("uid", "")))
        if state is None or state.assumed or state.node != node:
            return False
        if meta.get("deletionTimestamp") or (obj.get("status") or {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            return False
        old = state.pod.obj
        return bool(
            old.get("spec") == spec
            and (old.get("metadata") or {}).get("annotations") == meta.get("annotations")
        )

    # -- scheduling loop ------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Schedules until `stop` is set."""
        while not stop.is_set():
            qp = self.queue.pop(timeout_s=0.5)
            if qp is None:
                continue
            try:
                self.schedule_one(qp)
            except Exception:
                log.exception("scheduling cycle failed", extra={"pod": qp.pod.key})
                self.queue.requeue_backoff(qp)

    def schedule_one(self, qp: QueuedPod) -> None:
        self._cycle_thread = threading.get_ident()
        try:
            self._schedule_one(qp)
        finally:
            self._cycle_thread = None
            self._run_after_cycle()

    def _schedule_one(self, qp: QueuedPod) -> None:
        pod = qp.pod
        fwk = self.frameworks.get(pod.scheduler_name)
        if fwk is None or pod.deleting or pod.uid in self._cache.pods:
            self.queue.done(pod.uid)
            return
        state = CycleState()
        cache = self._cache
        with cache.lock:
            began = time.perf_counter()
            began_cpu = time.thread_time()
            total = len(cache.nodes)
            status, node, diagnosis = self._find_node(fwk, state, pod, total)
            metrics.FILTER_SCORE_SECONDS.observe(time.perf_counter() - began)
            metrics.FILTER_SCORE_CPU_SECONDS.observe(time.thread_time() - began_cpu)
            if node is None:
                qp.rejected_by = rejecting_plugins(diagnosis)
                self._fail(fwk, qp, status, failure_message(total, diagnosis))
                return
            cache.assume_pod(pod, node)
            status = fwk.run_reserve(state, pod, node)
            if not status.ok:
                cache.forget_pod(pod.uid)
                qp.rejected_by = frozenset({status.plugin} - {""})
                self._fail(fwk, qp, status, f"0/{total} nodes are available: {status.message()}.")
                return
            permit, waits = fwk.run_permit(state, pod, node)
            if not permit.ok and permit.code != Code.WAIT:
                fwk.run_unreserve(state, pod, node)
                cache.forget_pod(pod.uid)
                qp.rejected_by = frozenset({permit.plugin} - {""})
                self._fail(fwk, qp, permit, permit.message())
                return
        binding = _Binding(fwk, state, qp, node)
        if permit.code == Code.WAIT:
            waiting = _WaitingPod(self, binding, waits)
            with self._waiting_lock:
                self._waiting[pod.uid] = waiting
            waiting.start()
            return
        self._submit(binding)

    def _find_node(
        self, fwk: Framework, state: CycleState, pod: PodInfo, total: int
    ) -> tuple[Status, str | None, Diagnosis]:
        diagnosis = Diagnosis({})
        if pod.parse_errors:
            status = unresolvable(*pod.parse_errors)
            diagnosis.prefilter = status
            return status, None, diagnosis
        pre, status = fwk.run_pre_filter(state, pod)
        if not status.ok:
            diagnosis.prefilter = status
            if status.code == Code.UNSCHEDULABLE:  # as upstream: preemption may make room
                _, diagnosis.postfilter = fwk.run_post_filter(state, pod, diagnosis)
            return status, None, diagnosis
        feasible, diagnosis = fwk.find_feasible(state, pod, pre, total)
        if not feasible:
            _, post = fwk.run_post_filter(state, pod, diagnosis)
            diagnosis.postfilter = post
            return post, None, diagnosis
        return SUCCESS, fwk.select_host(feasible, state, pod), diagnosis

    def _fail(self, fwk: Framework, qp: QueuedPod, status: Status, message: str) -> None:
        metrics.ATTEMPTS.labels("unschedulable", fwk.scheduler_name).inc()
        log.info("pod unschedulable: %s", message, extra={"pod": qp.pod.key})
        self.event(qp.pod, "Warning", "FailedScheduling", message)
        internal = status.code == Code.ERROR
        if not self._stopping:  # pods rejected at Permit as the scheduler stops are not at fault
            reason = SCHEDULER_ERROR if internal else UNSCHEDULABLE
            self.conditions.unschedulable(qp.pod, reason, message)
        if internal:
            self.queue.requeue_backoff(qp)
        else:
            self.queue.add_unschedulable(qp)

    # -- binding cycle --------------------------------------------------------------------

    def _submit(self, binding: _Binding) -> None:
        with self._idle:
            self._binds_in_flight += 1
        if self._stopping:
            self._drop_bind(binding)
            return
        assigned = self._protocol.annotations.assigned_devices
        if (
            assigned in binding.state.binding_annotations
            and self._serial_admission(binding.node)
            and not self.admission.enter(
                binding.node, binding.queued.pod.uid, lambda: self._start_bind(binding)
            )
        ):
            # The node's previous device pod is still in admission: bound after it. A
            # waiting binding holds no bind slot, so it never stalls the scheduling loop.
            return
        self._bind_slots.acquire()  # backpressure: bounded binds in flight
        binding.slot = True
        self._start_bind(binding)

    def _serial_admission(self, node_name: str) -> bool:
        """Whether the node's device pods are bound one at a time (docs/protocol.md)."""
        with self._cache.lock:
            node = self._cache.nodes.get(node_name)
            return node is None or node.serial_admission

    def _start_bind(self, binding: _Binding) -> None:
        try:
            future = self._pool.submit(self._bind, binding)
        except RuntimeError:  # pool shut down
            self._drop_bind(binding)
            return

        def dropped(f: Future[None]) -> None:
            if f.cancelled():  # by stop(): never sent
                self._drop_bind(binding)

        future.add_done_callback(dropped)

    def _drop_bind(self, binding: _Binding) -> None:
        """A bind never sent (the scheduler stops): its placement is forgotten."""
        self._bind_done(binding)
        self._forget(binding)
        self._admitted(binding.queued.pod.uid)

    def _bind_done(self, binding: _Binding) -> None:
        if binding.slot:
            binding.slot = False
            self._bind_slots.release()
        with self._idle:
            self._binds_in_flight -= 1
            self._idle.notify_all()

    def wait_binds(self, timeout_s: float = 10.0) -> bool:
        """Waits until no binding is in flight (tests, benchmarks)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._binds_in_flight == 0, timeout_s)

    def _waiting_done(self, waiting: _WaitingPod, rejection: Status | None) -> None:
        with self._waiting_lock:
            self._waiting.pop(waiting.pod.uid, None)
        b = waiting.binding
        if rejection is None:
            if self._cycle_thread == threading.get_ident():
                # allowed in a cycle (a gang's last member): bound once the cycle is over, as
                # the bind may wait for a slot, which must not happen under the cache lock
                self._after_cycle.append(lambda: self._submit(b))
            else:
                self._submit(b)
            return
        b.framework.run_unreserve(b.state, b.queued.pod, b.node)
        self._cache.forget_pod(b.queued.pod.uid)
        if rejection.message() == "pod deleted":
            self.queue.done(b.queued.pod.uid)
        else:
            b.queued.rejected_by = frozenset(rejection.plugin.split(",")) - {""}
            self._fail(b.framework, b.queued, rejection, rejection.message())
        self._cluster_event(ClusterEvent.POD_DELETE)  # what it held is free again

    def _forget(self, b: _Binding) -> None:
        """Releases what the cycle assumed, unless the watch confirmed the pod bound
        meanwhile (an earlier Binding of it landed): then the devices are the pod's own."""
        with self._cache.lock:
            if self._cache.is_assumed(b.queued.pod.uid):
                b.framework.run_unreserve(b.state, b.queued.pod, b.node)
                self._cache.forget_pod(b.queued.pod.uid)

    def _bind(self, b: _Binding) -> None:
        pod = b.queued.pod
        began = time.perf_counter()
        try:
            try:
                status = b.framework.run_pre_bind(b.state, pod, b.node)
                if status.ok:
                    status = b.framework.run_bind(b.state, pod, b.node)
            except Exception as exc:
                log.exception("binding cycle failed", extra={"pod": pod.key})
                status = error(str(exc))
            metrics.BIND_SECONDS.observe(time.perf_counter() - began)
            if status.ok:
                self.bound += 1
                metrics.ATTEMPTS.labels("scheduled", b.framework.scheduler_name).inc()
                b.framework.run_post_bind(b.state, pod, b.node)
                self.queue.done(pod.uid)
                self.event(
                    pod, "Normal", "Scheduled", f"Successfully assigned {pod.key} to {b.node}"
                )
                return
            if status.outcome_unknown:
                self._await_outcome(b, status.message())
                return
            self.bind_failures += 1
            self._forget(b)
            self._admitted(pod.uid)
            message = status.message()
            log.warning("binding failed: %s", message, extra={"pod": pod.key, "node": b.node})
            self.event(pod, "Warning", "FailedScheduling", f"Binding rejected: {message}")
            if any(m in message for m in ("already assigned", "not found", "being deleted")):
                # bound elsewhere, gone or going: the watch tells the truth
                self.queue.done(pod.uid)
            else:
                self.conditions.unschedulable(pod, SCHEDULER_ERROR, f"Binding rejected: {message}")
                self.queue.requeue_backoff(b.queued)
        finally:
            self._bind_done(b)

    def _await_outcome(self, b: _Binding, message: str) -> None:
        """A Binding without an answer may have been written: the pod stays assumed (devices
        held, its node's admission too) until the watch shows it bound (confirmed) or
        deleted, at most `assumed_expiry_s`; then it is forgotten and tried again."""
        pod = b.queued.pod
        log.warning(
            "binding outcome unknown, placement held until the watch shows the pod: %s",
            message,
            extra={"pod": pod.key, "node": b.node},
        )

        def expire() -> None:
            with self._cache.lock:
                if self._stopping or not self._cache.is_assumed(pod.uid):
                    return  # bound after all, deleted, or no longer ours to schedule
                self._forget(b)
            self.bind_failures += 1
            self._admitted(pod.uid)
            why = (
                f"Binding rejected: {message} (no answer; the pod did not show bound within "
                f"{self.assumed_expiry_s:g}s)"
            )
            self.event(pod, "Warning", "FailedScheduling", why)
            self.conditions.unschedulable(pod, SCHEDULER_ERROR, why)
            self.queue.requeue_backoff(b.queued)

        self._timers.add(self.assumed_expiry_s, expire)

    def stop(self) -> None:
        """Stops at once: no new cycle, no new bind (the binds not sent yet are dropped: a
        replica that lost its lease must not bind, the new leader places those pods), pods
        waiting at Permit are rejected; returns once the binds already sent are answered."""
        if self._stopping:
            return
        self._stopping = True
        self.queue.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._waiting_lock:
            waiting = list(self._waiting.values())
        for w in waiting:
            w.reject("", "scheduler stopping")
        self._pool.shutdown(wait=True)
        self.conditions.stop()
        self.evictor.stop()
