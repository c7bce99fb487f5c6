"""Node reconciler: the enable label's value is the wish, one Job per node makes it so.

Level-triggered and keyed by node name (Node events and events of the node's Jobs
both enqueue it), so label flapping only ever acts on the latest wish:

1. read the Node (gone: nothing to do, its Jobs are garbage-collected through
   their owner reference) and every Job of the node;
2. Jobs for the other action (superseded wishes) are deleted: a running one with
   Foreground propagation (the Job object stays until its pod is gone) and the
   node is requeued until they have disappeared (1 s, then backing off up to
   DELETION_POLL_MAX_S; a Job's DELETED event requeues it at once; one Warning
   event when the wait exceeds STUCK_DELETION_S); a new Job is only ever created
   when no other Job of the node exists;
3. the Job for the wished action: running -> the node's state names it, and while it
   runs its pod is looked at (after START_CHECK_S, then less often) so that a pod that
   cannot start puts its cause into the node's message long before the Job's deadline;
   succeeded/failed -> JobRecorder records it; a failed one is deleted (and the
   node's next Job created) once its retry time on the Node has come, or at once
   when the label was re-applied or changed meanwhile (that also resets the
   attempt count);
4. no Job and the state not yet as wished -> create the Job (deterministic name:
   AlreadyExists means it is there already, never a duplicate) and record
   enabling/disabling with the Job's name and time.
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass

from lj_runtimekit.controller.internal.config.config import ControllerSettings
from lj_runtimekit.controller.internal.controller.job_recorder import (
    JobRecorder,
    JobView,
    not_started_cause,
    owned_by,
)
from lj_runtimekit.controller.internal.jobspec import jobspec
from lj_runtimekit.controller.internal.kube.client import Kube, Obj
from lj_runtimekit.controller.internal.nodestate.state import (
    ATTEMPTS_ANNOTATION,
    IN_PROGRESS,
    MESSAGE_ANNOTATION,
    MESSAGE_LIMIT,
    RFC3339,
    Action,
    NodeState,
    desired_action,
    label_value_is_invalid,
    transition,
)
from lj_runtimekit.controller.internal.workqueue.queue import Requeue
from lj_runtimekit.proto.pkg.kube import AlreadyExistsError

_log = logging.getLogger(__name__)
DELETION_POLL_S = 1.0
DELETION_POLL_MAX_S = 30.0
STUCK_DELETION_S = 60.0
"""A superseded Job still there after this long gets one Warning event on the node."""
START_CHECK_S = 3.0
"""First look at a running Job's pod; then every Job age, at most START_CHECK_MAX_S apart."""
START_CHECK_MAX_S = 30.0


@dataclass(frozen=True)
class SelectorTerm:
    """One equality-based label selector term."""

    key: str
    op: str  # exists, absent, eq, ne
    value: str = ""

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether `labels` satisfy the term."""
        if self.op == "exists":
            return self.key in labels
        if self.op == "absent":
            return self.key not in labels
        if self.op == "eq":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value


def parse_selector(selector: str) -> list[SelectorTerm]:
    """Parse a selector already validated by config.check_selector."""
    terms: list[SelectorTerm] = []
    for raw in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append(SelectorTerm(key, "ne", value))
        elif "=" in raw:
            key, value = raw.replace("==", "=").split("=", 1)
            terms.append(SelectorTerm(key, "eq", value))
        elif raw.startswith("!"):
            terms.append(SelectorTerm(raw[1:], "absent"))
        else:
            terms.append(SelectorTerm(raw, "exists"))
    return terms


class NodeController:
    """Reconciles one node at a time (the work queue serializes per node)."""

    def __init__(self, kube: Kube, settings: ControllerSettings, recorder: JobRecorder) -> None:
        self.kube = kube
        self.settings = settings
        self.recorder = recorder
        self.scope = parse_selector(settings.node_selector)
        self.created = 0
        self.retried = 0
        self._warned: dict[str, str] = {}
        self._renewed: set[str] = set()
        self._superseded: dict[str, set[str]] = {}
        self._deleting: dict[str, _Wait] = {}

    def wish_renewed(self, name: str) -> None:
        """The node's label was changed or re-applied: a failed action is retried at once."""
        self._renewed.add(name)

    def in_scope(self, node: Obj) -> bool:
        """Whether the node matches --node-selector."""
        labels = node.get("metadata", {}).get("labels") or {}
        return all(term.matches(labels) for term in self.scope)

    async def reconcile(self, name: str) -> Requeue | None:
        """Bring the node one step closer to its wish; see the module docstring."""
        renewed = name in self._renewed
        self._renewed.discard(name)
        node = await self.kube.read_node(name)
        if node is None:
            self._warned.pop(name, None)
            self._superseded.pop(name, None)
            self._deleting.pop(name, None)
            _log.debug("node gone; its Jobs go with it", extra={"node": name})
            return None
        if not self.in_scope(node):
            return None
        meta = node["metadata"]
        value = (meta.get("labels") or {}).get(self.settings.label_key)
        state = NodeState.from_annotations(meta.get("annotations"))
        await self._warn_invalid_value(node, value)
        target = desired_action(value, state)
        namespace = self.settings.job.namespace

        jobs = [
            JobView.of(j)
            for j in await self.kube.list_jobs(namespace, jobspec.node_selector(name))
            if (j["metadata"].get("annotations") or {}).get(jobspec.NODE_ANNOTATION) == name
        ]
        blocking: list[JobView] = []
        current: JobView | None = None
        for job in jobs:
            if job.phase == "deleting":
                blocking.append(job)
            elif job.action == target and target is not None:
                current = job
            else:
                blocking.append(job)
                await self._supersede(node, job, target)
        waiting = bool(blocking)
        if not waiting:
            self._deleting.pop(name, None)

        if target is None:
            return self._wait_for_deletion(node, blocking) if waiting else None

        if current is not None:
            if current.phase == "active":
                in_progress = IN_PROGRESS[target]
                if state.state != in_progress or state.job != current.ref:
                    await self.kube.patch_node(
                        name,
                        transition(
                            in_progress, target, current.ref, None, state.attempts_for(target)
                        ),
                        None,
                    )
                    _log.info("adopted running job", extra={"node": name, "job": current.ref})
                    return Requeue(START_CHECK_S, "job running")
                return await self._check_start(name, state, current)
            if waiting:
                return self._wait_for_deletion(node, blocking)
            if current.phase == "succeeded":
                await self.recorder.record_success(node, state, current)
                return None
            return await self._after_failure(node, state, current, renewed)

        if waiting:
            return self._wait_for_deletion(node, blocking)
        if state.settled_for(target):
            return None
        return await self._start(node, state, target)

    def _wait_for_deletion(self, node: Obj, blocking: list[JobView]) -> Requeue:
        """Look again for the Jobs being deleted, less often the longer it takes; say once
        on the node what it waits for when that exceeds STUCK_DELETION_S."""
        name = node["metadata"]["name"]
        wait = self._deleting.setdefault(name, _Wait(time.monotonic()))
        wait.polls += 1
        waited_s = time.monotonic() - wait.since
        if waited_s >= STUCK_DELETION_S and not wait.warned:
            wait.warned = True
            refs = ", ".join(job.ref for job in blocking)
            _log.warning(
                "superseded job stuck deleting",
                extra={"node": name, "jobs": refs, "waited_s": round(waited_s)},
            )
            self.kube.node_event(
                self.recorder.event_namespace,
                node,
                "Warning",
                "FeatureJobDeletionStuck",
                f"waiting {waited_s:.0f} s for Job {refs} to be deleted (Foreground deletion"
                " waits for its pods to be gone) before the node's next Job can start",
            )
        delay = min(DELETION_POLL_MAX_S, DELETION_POLL_S * 2 ** max(0, wait.polls - 2))
        return Requeue(delay, "superseded Job deleting")

    async def _check_start(self, name: str, state: NodeState, job: JobView) -> Requeue:
        """Put the cause of a pod that cannot start into the node's message (once per
        cause); look again later while the Job runs."""
        age_s = _age_s(state.since)
        if age_s >= START_CHECK_S:
            pods = await self.kube.list_pods(job.namespace, f"job-name={job.name}")
            cause = not_started_cause([p for p in pods if owned_by(p, job.uid)], age_s)
            if cause is not None:
                message = f"{job.action} Job {job.ref} not started: {cause}"[:MESSAGE_LIMIT]
                if message != state.message:
                    await self.kube.patch_node(
                        name, {"metadata": {"annotations": {MESSAGE_ANNOTATION: message}}}, None
                    )
                    _log.warning(
                        "feature job not started",
                        extra={"node": name, "job": job.ref, "cause": cause},
                    )
        return Requeue(min(START_CHECK_MAX_S, max(START_CHECK_S, age_s)), "job running")

    async def _after_failure(
        self, node: Obj, state: NodeState, job: JobView, renewed: bool
    ) -> Requeue | None:
        """Record the failed Job; delete it for a retry when the retry time has come or the
        label was re-applied (the next reconcile creates the Job again)."""
        name = node["metadata"]["name"]
        state = await self.recorder.record_failure(node, state, job)
        if renewed:
            await self.kube.patch_node(
                name, {"metadata": {"annotations": {ATTEMPTS_ANNOTATION: None}}}, None
            )
            _log.info("label re-applied; retrying the failed job", extra={"node": name})
        else:
            wait_s = state.retry_in_s(datetime.datetime.now(datetime.UTC))
            if wait_s is None:
                return None
            if wait_s > 0:
                return Requeue(wait_s, "retry backoff")
            _log.info(
                "retrying the failed job",
                extra={"node": name, "job": job.ref, "attempts": state.attempts},
            )
        self.retried += 1
        await self.recorder.delete(job, "Background")
        return Requeue(DELETION_POLL_S, "failed Job deleting for a retry")

    async def _supersede(self, node: Obj, job: JobView, target: Action | None) -> None:
        """Delete a Job of the other action: the latest wish wins."""
        name = node["metadata"]["name"]
        propagation = "Foreground" if job.phase == "active" else "Background"
        self._superseded.setdefault(name, set()).add(job.ref)
        if await self.recorder.delete(job, propagation) and job.phase == "active":
            _log.info(
                "job superseded by a newer wish",
                extra={"node": name, "job": job.ref, "wish": target or "none"},
            )
            self.kube.node_event(
                self.recorder.event_namespace,
                node,
                "Normal",
                "FeatureJobSuperseded",
                f"{job.action} Job {job.ref} deleted: the node's label now asks to"
                f" {target or 'leave the features alone'}",
            )

    async def _start(self, node: Obj, state: NodeState, target: Action) -> Requeue | None:
        """Create the Job for `target` and record the in-progress state."""
        meta = node["metadata"]
        name = meta["name"]
        if state.state == "failed" and state.action == target:
            _log.info("failed job is gone; retrying", extra={"node": name, "job": state.job or ""})
        elif (
            state.job
            and state.state == IN_PROGRESS[target]
            and state.job not in self._superseded.get(name, ())
        ):
            _log.warning(
                "job vanished before finishing; creating it again",
                extra={"node": name, "job": state.job},
            )
        manifest = jobspec.build(
            self.settings.job,
            target,
            name,
            meta.get("uid", ""),
            (node.get("spec") or {}).get("taints"),
        )
        job_ref = f"{manifest['metadata']['namespace']}/{manifest['metadata']['name']}"
        try:
            await self.kube.create_job(manifest)
        except AlreadyExistsError:
            # Created meanwhile or still being deleted: look again shortly.
            return Requeue(DELETION_POLL_S / 2, "job of that name exists")
        self.created += 1
        self._superseded.pop(name, None)
        attempts = state.attempts_for(target)
        await self.kube.patch_node(
            name, transition(IN_PROGRESS[target], target, job_ref, None, attempts), None
        )
        _log.info("job created", extra={"node": name, "job": job_ref, "action": target})
        self.kube.node_event(
            self.recorder.event_namespace,
            node,
            "Normal",
            "FeaturesEnabling" if target == "enable" else "FeaturesDisabling",
            f"created {target} Job {job_ref}",
        )
        return Requeue(START_CHECK_S, "job started")

    async def _warn_invalid_value(self, node: Obj, value: str | None) -> None:
        """A label value other than true/false: one Warning event per value."""
        name = node["metadata"]["name"]
        if not label_value_is_invalid(value):
            self._warned.pop(name, None)
            return
        assert value is not None
        if self._warned.get(name) == value:
            return
        self._warned[name] = value
        message = (
            f"label {self.settings.label_key}={value!r} on node {name} is not 'true': the"
            " Runtime Kit features stay off (or are switched off) on this node"
        )
        _log.warning(
            "invalid label value",
            extra={"node": name, "label": self.settings.label_key, "value": value},
        )
        self.kube.node_event(
            self.recorder.event_namespace, node, "Warning", "InvalidLabelValue", message
        )


@dataclass
class _Wait:
    """A node waiting for Jobs to be deleted: since when, how often looked, warned yet."""

    since: float
    polls: int = 0
    warned: bool = False


def _age_s(since: str | None) -> float:
    """Seconds since an RFC 3339 time on the Node (0 when absent or unreadable)."""
    try:
        then = datetime.datetime.strptime(since or "", RFC3339).replace(tzinfo=datetime.UTC)
    except ValueError:
        return 0.0
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()
