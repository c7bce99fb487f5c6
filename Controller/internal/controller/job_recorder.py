"""Finished Jobs: record the outcome on the Node, then clean up or keep for debugging.

- Succeeded: the Node's state becomes enabled/disabled (annotation + label), a
  Normal event is posted on the Node, and the Job is deleted with
  propagationPolicy=Background so that its pods go too (`ttlSecondsAfterFinished`
  is not used: it would delete failed Jobs as well).
- Failed: the Node's state becomes failed with the agent's one-line message
  (the container's termination message), a Warning event carrying it is posted
  once (the Job is then annotated as recorded), and the Job is kept. A retryable
  failure (any reason but the pod failure policy, which fails the Job at once on
  the agent's permanent exit codes) also gets the attempt count and the time of
  the next retry (RetryPolicy) on the Node, until the cap.

Every step is idempotent, so a restart between two steps repeats at most one
event.

Not a reconciler of its own: the node reconciler calls it for the node's Job of
the wished action, under the node's work-queue key. Recording an outcome on the
Node, deleting a Job and creating the node's next Job are thus never concurrent
for one node; a reconciler keyed by Job would race the node reconciler (which
could read the state from before the outcome, find the Job deleted and start
the same action again) and would need the node's label to tell a current Job
from a superseded one.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from lj_runtimekit.controller.internal.config.config import RetryPolicy
from lj_runtimekit.controller.internal.jobspec import jobspec
from lj_runtimekit.controller.internal.kube.client import Kube, Obj
from lj_runtimekit.controller.internal.nodestate.state import (
    DONE,
    Action,
    NodeState,
    retry_time,
    transition,
)

_log = logging.getLogger(__name__)
Phase = Literal["active", "succeeded", "failed", "deleting"]
PERMANENT_REASON = "PodFailurePolicy"
"""The Job's Failed reason when the agent exited with a code that retrying cannot fix."""


@dataclass(frozen=True)
class JobView:
    """What the reconcilers need to know about one Job."""

    namespace: str
    name: str
    uid: str
    node: str
    action: Action | None
    phase: Phase
    recorded: bool
    reason: str
    message: str

    @property
    def ref(self) -> str:
        """`namespace/name`, as written on the Node."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, job: Obj) -> JobView:
        """Interpret a Job object."""
        meta = job.get("metadata", {})
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        action = labels.get(jobspec.ACTION_LABEL)
        phase: Phase = "active"
        reason = message = ""
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition.get("status") != "True":
                continue
            if condition.get("type") == "Complete":
                phase = "succeeded"
            elif condition.get("type") == "Failed":
                phase = "failed"
                reason = condition.get("reason", "")
                message = condition.get("message", "")
        if meta.get("deletionTimestamp"):
            phase = "deleting"
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            node=annotations.get(jobspec.NODE_ANNOTATION, ""),
            action=cast(Action, action) if action in ("enable", "disable") else None,
            phase=phase,
            recorded=jobspec.RECORDED_ANNOTATION in annotations,
            reason=reason,
            message=message,
        )


def termination_message(pods: list[Obj]) -> str | None:
    """The agent's one-line result from the newest failed pod, if any pod left one."""

    def started(pod: Obj) -> str:
        return str(pod.get("metadata", {}).get("creationTimestamp", ""))

    for pod in sorted(pods, key=started, reverse=True):
        status: dict[str, Any] = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            if container.get("name") != jobspec.CONTAINER:
                continue
            terminated = (container.get("state") or {}).get("terminated") or {}
            text = (terminated.get("message") or "").strip()
            if text:
                code = terminated.get("exitCode")
                return f"{text} (exit code {code})" if code is not None else text
        if status.get("message"):
            return str(status["message"]).strip()
    return None


STARTING_REASONS = ("ContainerCreating", "PodInitializing")
"""Waiting reasons of a container on its normal way to start."""
SLOW_START_S = 20.0
"""A container still ContainerCreating for this long is reported: usually a volume that
does not mount (the socket directory missing on the node), which pod status does not name."""


def not_started_cause(pods: list[Obj], age_s: float) -> str | None:
    """Why the newest pod's agent has not started, as the pod's status tells it: a waiting
    reason (ImagePullBackOff, CreateContainerConfigError, ...) with its message, a pod
    condition that is False with a message (e.g. Unschedulable), or ContainerCreating for
    SLOW_START_S of the Job's `age_s`. None when nothing is wrong (yet)."""

    def started(pod: Obj) -> str:
        return str(pod.get("metadata", {}).get("creationTimestamp", ""))

    for pod in sorted(pods, key=started, reverse=True):
        status: dict[str, Any] = pod.get("status") or {}
        name = pod.get("metadata", {}).get("name", "?")
        containers = (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        )
        for container in containers:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason") or ""
            if reason and reason not in STARTING_REASONS:
                text = (waiting.get("message") or "").strip()
                return f"pod {name}: {reason}: {text}" if text else f"pod {name}: {reason}"
            if reason == "ContainerCreating" and age_s >= SLOW_START_S:
                return (
                    f"pod {name}: ContainerCreating for {age_s:.0f} s (a volume that does not"
                    " mount? see the pod's events, e.g. the socket directory missing on the node)"
                )
        for condition in status.get("conditions") or []:
            if condition.get("status") == "False" and condition.get("message"):
                why = condition.get("reason") or condition.get("type")
                return f"pod {name}: {why}: {str(condition['message']).strip()}"
        return None
    return None


class JobRecorder:
    """The node reconciler's Job steps: records a finished Job on its Node, deletes Jobs
    (successful ones once recorded, superseded ones)."""

    def __init__(
        self,
        kube: Kube,
        event_namespace: str,
        retry: RetryPolicy | None = None,
        done: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.kube = kube
        self.event_namespace = event_namespace
        self.retry = retry or RetryPolicy()
        self.succeeded = 0
        self.failed = 0
        self.done = done or (lambda node, action, outcome: None)
        """Told (node, action, `succeeded` or `failed`) when a node's action ends: succeeded,
        or failed with no retry scheduled."""

    async def delete(self, job: JobView, propagation: str) -> bool:
        """Delete the Job (this uid only); False when it was already gone."""
        deleted = await self.kube.delete_job(job.namespace, job.name, job.uid, propagation)
        if deleted:
            _log.info(
                "job deleted",
                extra={"node": job.node, "job": job.ref, "propagation": propagation},
            )
        return deleted

    async def record_success(self, node: Obj, state: NodeState, job: JobView) -> None:
        """Node state -> enabled/disabled (+ Normal event) once, then delete the Job."""
        assert job.action is not None
        done = DONE[job.action]
        name = node["metadata"]["name"]
        if state.state != done or state.job != job.ref:
            message = f"{job.action} Job {job.ref} succeeded"
            await self.kube.patch_node(name, transition(done, job.action, job.ref, message), None)
            self.kube.node_event(
                self.event_namespace,
                node,
                "Normal",
                "FeaturesEnabled" if job.action == "enable" else "FeaturesDisabled",
                f"Runtime Kit features {done} on node {name} by Job {job.ref}",
            )
            self.succeeded += 1
            self.done(name, job.action, "succeeded")
            _log.info("features " + done, extra={"node": name, "job": job.ref})
        await self.delete(job, "Background")

    async def record_failure(self, node: Obj, state: NodeState, job: JobView) -> NodeState:
        """Node state -> failed with the agent's message, the attempt count and, for a
        retryable failure below the cap, the next retry time; a Warning event once; keep
        the Job. Returns the Node's state as recorded."""
        assert job.action is not None
        if job.recorded and state.state == "failed" and state.job == job.ref:
            return state
        name = node["metadata"]["name"]
        if state.state == "failed" and state.job == job.ref:
            recorded = state  # recorded on the Node, not yet on the Job
        else:
            recorded = await self._record_failed(name, state, job)
            if recorded.retry_at is None:
                self.done(name, job.action, "failed")
        if not job.recorded:
            self.kube.node_event(
                self.event_namespace, node, "Warning", "FeatureJobFailed", recorded.message or ""
            )
            await self.kube.annotate_job(
                job.namespace, job.name, {jobspec.RECORDED_ANNOTATION: "failed"}
            )
            self.failed += 1
        _log.warning(
            "feature job failed; kept for debugging",
            extra={
                "node": name,
                "job": job.ref,
                "reason": job.reason or "Failed",
                "attempts": recorded.attempts,
                "retry_at": recorded.retry_at or "never",
            },
        )
        return recorded

    async def _record_failed(self, name: str, state: NodeState, job: JobView) -> NodeState:
        assert job.action is not None
        # `job-name` is set by every Kubernetes >= 1.18 (`batch.kubernetes.io/...` from 1.27).
        pods = await self.kube.list_pods(job.namespace, f"job-name={job.name}")
        agent = termination_message([p for p in pods if owned_by(p, job.uid)])
        why = job.reason or "Failed"
        detail = agent or job.message or "no termination message (see the Job's pods)"
        attempts = state.attempts_for(job.action) + 1
        retry_at: str | None = None
        if why == PERMANENT_REASON:
            outcome = "not retried (permanent); re-apply the label to retry"
        else:
            delay = self.retry.delay_s(attempts)
            if delay is None:
                outcome = (
                    f"attempt {attempts} of {self.retry.limit}: no more automatic retries;"
                    " re-apply the label to retry"
                )
            else:
                retry_at = retry_time(datetime.datetime.now(datetime.UTC), delay)
                outcome = (
                    f"attempt {attempts} of {self.retry.limit}: retrying in {delay:g} s"
                    f" (at {retry_at})"
                )
        message = f"{job.action} Job {job.ref} failed ({why}): {detail}; {outcome}"
        await self.kube.patch_node(
            name,
            transition("failed", job.action, job.ref, message, attempts, retry_at),
            None,
        )
        return NodeState("failed", job.action, job.ref, None, message, attempts, retry_at)


def owned_by(pod: Obj, uid: str) -> bool:
    """Whether the pod belongs to the Job of this uid."""
    refs = pod.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)
