"""Wiring: kopf watches Nodes and Jobs, a keyed work queue reconciles per node.

kopf provides what it is good at: list+watch with server-side label selectors,
reconnection after a dropped stream, the inactivity timeout that catches a
silently dead stream, per-object event batching. Its handlers here are
`on.event` handlers that only enqueue the node's name: the outcome for a node
depends on two kinds (the Node's label and the node's Jobs), so reconciliation
is level-triggered and keyed by node (see internal/controller/). This also keeps
kopf from storing anything on Nodes: no progress or diff-base annotations and
no finalizers (there is no delete handler; a Node deletion is never blocked).
Health endpoints are our own (internal/health/): they answer while a standby
replica waits for the Lease, before kopf runs.

Watches: Nodes with the enable label (plus --node-selector) cluster-wide, and
Jobs labelled managed-by=lj-runtimekit-controller in the Jobs' namespace.
A label removal makes the API server send DELETED for that Node on the
selector-filtered watch; the reconciler re-reads the Node, so that is handled
like any change. Nodes whose label went away while the Controller was down
still carry the Controller's state label and are found by the resync (all of
them at start-up, then those whose label and state disagree: twice soon after
start-up, for a label removed while the watches made their first list, then
periodically).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from lj_runtimekit.controller.internal.config.config import ControllerSettings
from lj_runtimekit.controller.internal.controller.job_recorder import JobRecorder, JobView
from lj_runtimekit.controller.internal.controller.node_controller import NodeController
from lj_runtimekit.controller.internal.health.server import HealthServer
from lj_runtimekit.controller.internal.jobspec import jobspec
from lj_runtimekit.controller.internal.kube.client import Kube
from lj_runtimekit.controller.internal.metrics.metrics import Counts, LabelToDone, exposition
from lj_runtimekit.controller.internal.nodestate.state import (
    STATE_LABEL,
    NodeState,
    desired_action,
)
from lj_runtimekit.controller.internal.workqueue.queue import WorkQueue
from lj_runtimekit.proto.pkg.kube import ApiAccess, KubeError
from lj_runtimekit.proto.pkg.leaderelection import LeaderElector, LeaseConfig

_log = logging.getLogger(__name__)
NODE_EVENT_NAMESPACE = "default"
"""Events about cluster-scoped objects live in `default` (as the kubelet's do)."""
SETTLE_DELAYS_S = (5.0, 25.0)
"""Waits before two extra passes over the unsettled nodes soon after start-up (at about 5
and 30 s). The start-up pass runs while kopf's watches make their first list; a label
removed in between is seen by neither: the node no longer matches the watch's selector,
and the start-up pass saw it labelled."""


LIST_PAGE = 100
"""Objects per page of kopf's lists (at start-up and when a watch's version expired)."""
WORKER_IDLE_TIMEOUT_S = 1.0
"""How long kopf's per-object worker waits for the object's next event before it ends
(kopf's default: 5 s), keeping that object's last event in memory meanwhile."""


@dataclass(frozen=True)
class WatchSettings:
    """kopf watch timing: a stream that brings nothing (not even a bookmark) for
    `inactivity_timeout_s` is considered dead and reopened."""

    server_timeout_s: float = 300.0
    client_timeout_s: float = 330.0
    connect_timeout_s: float = 10.0
    inactivity_timeout_s: float = 70.0
    reconnect_backoff_s: float = 1.0
    stall_timeout_s: float = 900.0
    """Liveness fails when the resync kept finding work for this long and no watch event
    came in that time: the watches are stuck although their streams look alive."""


def kopf_settings(settings: ControllerSettings, watch: WatchSettings) -> kopf.OperatorSettings:
    """kopf settings: server-side selectors, watch timeouts, nothing written to objects."""
    s = kopf.OperatorSettings()
    s.scanning.disabled = True  # no namespace/CRD scans: fewer permissions, nothing to discover
    s.posting.enabled = False  # the reconcilers post their own events on the Node
    s.watching.server_timeout = int(watch.server_timeout_s)  # timeoutSeconds is an integer
    s.watching.client_timeout = watch.client_timeout_s
    s.watching.connect_timeout = watch.connect_timeout_s
    s.watching.inactivity_timeout = watch.inactivity_timeout_s
    s.watching.reconnect_backoff = watch.reconnect_backoff_s
    # Memory: a listed or watched object stays in memory while its kopf worker idles (the
    # worker keeps its last event), and a list page is decoded at once.
    s.watching.chunk_size = LIST_PAGE
    s.queueing.idle_timeout = WORKER_IDLE_TIMEOUT_S
    s.watching.label_selectors["", "v1", "nodes"] = settings.node_watch_selector
    s.watching.label_selectors["batch", "v1", "jobs"] = jobspec.JOB_SELECTOR
    s.networking.request_timeout = 30.0
    s.networking.connect_timeout = watch.connect_timeout_s
    # Not used by on.event handlers; set anyway so that kopf never writes its own prefix.
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="lj-runtimekit.io")
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="lj-runtimekit.io", key="last-handled-configuration"
    )
    s.persistence.finalizer = "lj-runtimekit.io/unused-finalizer"
    return s


def connection_info(access: ApiAccess) -> kopf.ConnectionInfo:
    """kopf's credentials: the same server, CA, client certificate and token as the
    Controller's own client."""
    scheme, _, token = (access.authorization() or "").partition(" ")
    return kopf.ConnectionInfo(
        server=access.server,
        ca_path=access.ca_path,
        ca_data=access.ca_data,
        insecure=access.insecure,
        scheme=scheme or None,
        token=token or None,
        certificate_path=access.cert_path,
        certificate_data=access.cert_data,
        private_key_path=access.key_path,
        private_key_data=access.key_data,
    )


class Triggers:
    """Which watch events can change a node's outcome. Skipped: Node status updates (KWOK
    or the kubelet), the Node patches the reconciler makes itself (it already knows what
    comes next), and Job status churn until the Job finishes or goes."""

    def __init__(self, label_key: str, renewed: Callable[[str], None]) -> None:
        self.label_key = label_key
        self.renewed = renewed
        self._nodes: dict[str, tuple[str | None, str | None]] = {}
        self._jobs: dict[str, str] = {}

    def node(self, kind: str | None, name: str, body: Mapping[str, Any]) -> bool:
        """DELETED (gone, or the label removed: the watch is label-selected), first sight,
        or a new label value; a removed or changed label also tells `renewed`."""
        if kind == "DELETED":
            self._nodes.pop(name, None)
            self.renewed(name)
            return True
        meta = body.get("metadata") or {}
        key = (meta.get("uid"), (meta.get("labels") or {}).get(self.label_key))
        seen = self._nodes.get(name)
        if seen == key:
            return False
        if seen is not None and seen[0] == key[0]:
            self.renewed(name)
        self._nodes[name] = key
        return True

    def job(self, kind: str | None, body: Mapping[str, Any]) -> str | None:
        """The node to reconcile for a Job event: listed at start-up, deleted, or newly
        finished / being deleted."""
        meta = body.get("metadata") or {}
        node = (meta.get("annotations") or {}).get(jobspec.NODE_ANNOTATION)
        if not node:
            return None
        uid = str(meta.get("uid", ""))
        if kind == "DELETED":
            self._jobs.pop(uid, None)
            return str(node)
        phase = JobView.of(dict(body)).phase
        seen = self._jobs.get(uid)
        self._jobs[uid] = phase
        if kind is None:
            return str(node)
        if phase in ("succeeded", "failed", "deleting") and phase != seen:
            return str(node)
        return None

    def unsettled(self, meta: Mapping[str, Any]) -> bool:
        """Whether a listed node's label and state disagree (work left to do)."""
        state = NodeState.from_annotations(dict(meta.get("annotations") or {}))
        if state.state in ("enabling", "disabling"):
            return True
        wish = desired_action((meta.get("labels") or {}).get(self.label_key), state)
        if wish is None:
            return False
        if state.state == "failed" and state.action == wish:
            return state.retry_at is not None
        return not state.settled_for(wish)


class Controller:
    """The running Controller: leader election, watches, work queue, resync."""

    def __init__(
        self,
        settings: ControllerSettings,
        kube: Kube,
        login: Callable[[], ApiAccess],
        watch: WatchSettings | None = None,
        lease: LeaseConfig | None = None,
        health: HealthServer | None = None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.login = login
        self.watch = watch or WatchSettings()
        self.lease = lease
        self.health = health
        self.label_to_done = LabelToDone()
        self.recorder = JobRecorder(
            kube, NODE_EVENT_NAMESPACE, settings.retry, self.label_to_done.done
        )
        self.nodes = NodeController(kube, settings, self.recorder)
        self.queue = WorkQueue(self.nodes.reconcile, settings.workers)
        self.triggers = Triggers(settings.label_key, self.nodes.wish_renewed)
        self.last_watch_event = time.monotonic()
        self._work_since: float | None = None
        self._kopf: asyncio.Task[Any] | None = None
        if health is not None:
            health.metrics = exposition(self.counts, self.label_to_done.histogram)

    def counts(self) -> Counts:
        """What the Controller has done so far, for its metrics."""
        return Counts(
            jobs_created=self.nodes.created,
            jobs_succeeded=self.recorder.succeeded,
            jobs_failed=self.recorder.failed,
            retries=self.nodes.retried,
            reconciles=self.queue.processed,
            reconcile_errors=self.queue.errors,
            queue_depth=len(self.queue),
            leading=self.health is not None and self.health.ready,
        )

    def watch_event(self) -> None:
        """A watch delivered an event: the watches are alive."""
        self.last_watch_event = time.monotonic()

    def liveness(self) -> str | None:
        """Why this leading replica should be restarted (None: alive): kopf's task ended, or
        the periodic resync kept finding unsettled nodes for longer than the stall timeout
        while no watch event came in."""
        if self._kopf is not None and self._kopf.done():
            return "the watches (kopf) stopped"
        if self._work_since is None:
            return None
        now = time.monotonic()
        bound = self.watch.stall_timeout_s
        quiet_s = now - self.last_watch_event
        if now - self._work_since > bound and quiet_s > bound:
            return (
                f"watches stalled: no watch event for {quiet_s:.0f} s while the resync keeps"
                " finding unsettled nodes"
            )
        return None

    def registry(self) -> kopf.OperatorRegistry:
        """kopf handlers: log in, enqueue node names from Node and Job events."""
        registry = kopf.OperatorRegistry()
        login = self.login
        queue = self.queue
        seen = self.watch_event

        @kopf.on.login(registry=registry)
        def credentials(**_: Any) -> kopf.ConnectionInfo:
            return connection_info(login())  # on every (re-)login: in-cluster tokens rotate

        triggers = self.triggers
        label_changed = self.label_to_done.changed

        @kopf.on.event("", "v1", "nodes", registry=registry)
        async def node_event(
            type: str | None, name: str, body: Mapping[str, Any], **_: Any
        ) -> None:
            seen()
            if triggers.node(type, name, body):
                label_changed(name)
                queue.add(name)

        @kopf.on.event("batch", "v1", "jobs", registry=registry)
        async def job_event(type: str | None, body: Mapping[str, Any], **_: Any) -> None:
            seen()
            node = triggers.job(type, body)
            if node:
                queue.add(node)

        return registry

    async def resync_once(self, everything: bool) -> int:
        """Enqueue the nodes with the label or the Controller's state label: all of them
        (start-up) or those whose label and state disagree (periodic: catches a label removed
        while a watch was down for longer than the API server's event history)."""
        extra = f",{self.settings.node_selector}" if self.settings.node_selector else ""
        nodes: dict[str, Mapping[str, Any]] = {}
        for selector in (self.settings.node_watch_selector, STATE_LABEL + extra):
            nodes.update(await self.kube.node_metadata(selector))
        queued = 0
        for name, meta in nodes.items():
            if everything or self.triggers.unsettled(meta):
                self.queue.add(name)
                queued += 1
        if not everything:
            self._work_since = (self._work_since or time.monotonic()) if queued else None
        return queued

    async def resync_forever(self) -> None:
        """Every managed node at start-up, the unsettled ones after SETTLE_DELAYS_S, then
        every --resync-period."""
        everything = True
        settle = list(SETTLE_DELAYS_S)
        while True:
            try:
                count = await self.resync_once(everything)
                everything = False
                if count:
                    _log.info("resync", extra={"nodes_queued": count})
            except KubeError as exc:
                _log.warning("resync failed", extra={"error": str(exc)})
            await asyncio.sleep(settle.pop(0) if settle else self.settings.resync_period_s)

    async def run(self, stop: asyncio.Event) -> int:
        """Run until `stop` is set, kopf stops (signal) or leadership is lost (exit code 1)."""
        if self.health is not None:
            await self.health.start()
        try:
            return await self._run(stop)
        finally:
            if self.health is not None:
                await self.health.stop()

    async def _run(self, stop: asyncio.Event) -> int:
        elector = LeaderElector(self.kube.client, self.lease) if self.lease else None
        if elector is not None and not await elector.acquire_async(stop):
            return 0
        kopf_stop = asyncio.Event()
        self.queue.start()
        background: list[asyncio.Task[Any]] = [
            asyncio.create_task(self.resync_forever(), name="resync"),
        ]
        renewal = (
            asyncio.create_task(elector.renew_until_lost_async(), name="lease-renewal")
            if elector is not None
            else None
        )
        operator = asyncio.create_task(
            kopf.operator(
                registry=self.registry(),
                settings=kopf_settings(self.settings, self.watch),
                standalone=True,
                clusterwide=False,
                namespaces=[self.settings.job.namespace],
                stop_flag=kopf_stop,
            ),
            name="kopf",
        )
        self._kopf = operator
        waiters = [operator, asyncio.create_task(stop.wait(), name="stop")]
        if renewal is not None:
            waiters.append(renewal)
        _log.info(
            "controller running",
            extra={
                "label": self.settings.label_key,
                "namespace": self.settings.job.namespace,
                "image": self.settings.job.image,
                "leader_election": elector is not None,
            },
        )
        code = 0
        lost = False
        if self.health is not None:
            self.health.ready = True
            self.health.alive = self.liveness
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            lost = renewal is not None and renewal.done() and not renewal.cancelled()
            if lost:
                code = 1
            if operator.done() and operator.exception() is not None:
                _log.error("watching stopped", extra={"error": str(operator.exception())})
                code = 1
        finally:
            kopf_stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(operator, 10)
            for task in waiters + background:
                task.cancel()
            for task in waiters + background:
                with contextlib.suppress(BaseException):
                    await task
            await self.queue.stop()
            await self.kube.drain_events()
            if elector is not None and not lost:
                await elector.release_async()
        _log.info("controller stopped", extra={"exit_code": code})
        return code
