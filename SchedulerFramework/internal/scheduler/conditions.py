"""The pod condition PodScheduled=False, written as kube-scheduler writes it.

A pod the scheduler cannot place gets condition `PodScheduled` with status
`False`, reason `Unschedulable` and the failure message (reason
`SchedulerError` when an internal error, such as a failed bind, stopped it);
the cluster-autoscaler scales up only for pods with it. As kube-scheduler
does: a strategic merge patch of the pod's status conditions, only when the
condition changes (status, reason or message), its lastTransitionTime moved
only when the status does. The Binding sets `PodScheduled=True` (the API
server does that).

The writes go through one thread and a bounded queue, so a failing pod never
makes the scheduling loop wait on the API server (a full queue drops the
write; the pod's next failure writes again). Each patch carries the
resourceVersion of the pod object the failure was decided on: the API server
refuses it (409) when the pod changed since, so a late write never marks a
pod that was bound meanwhile. A pod changed otherwise (its previous condition
written, its claims named) is read again and, still unbound, gets the write
with its new resourceVersion: a failure that ended the pod's tries (a gang
refused whole) never leaves an earlier message standing.
"""

from __future__ import annotations

import logging
from typing import Any

from lj_runtimekit.proto.pkg.kube import STRATEGIC_MERGE_PATCH, KubeClient, KubeError, api_time
from lj_runtimekit.schedulerframework.internal.cache.podinfo import KubeObject, PodInfo
from lj_runtimekit.schedulerframework.internal.scheduler.worker import Worker

log = logging.getLogger(__name__)

POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"
"""Reason: no node fits the pod (v1.PodReasonUnschedulable)."""
SCHEDULER_ERROR = "SchedulerError"
"""Reason: an internal error stopped the pod's scheduling (v1.PodReasonSchedulerError)."""


def scheduled_false(obj: KubeObject, reason: str, message: str, now: str) -> dict[str, Any] | None:
    """The PodScheduled=False condition to write on pod `obj`, or None when the pod shows
    it already (podutil.UpdatePodCondition: lastTransitionTime kept while the status is)."""
    old: dict[str, Any] | None = None
    for c in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == POD_SCHEDULED:
            old = c
    was_false = old is not None and old.get("status") == "False"
    if (
        old is not None
        and was_false
        and (old.get("reason"), old.get("message"))
        == (
            reason,
            message,
        )
    ):
        return None
    since = old.get("lastTransitionTime") if old is not None and was_false else None
    return {
        "type": POD_SCHEDULED,
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": since or now,
    }


def status_patch(condition: dict[str, Any], resource_version: str) -> dict[str, Any]:
    """The strategic merge patch of the pod's status that writes `condition`, refused (409)
    when the pod's resourceVersion is no longer `resource_version` (none: unconditional)."""
    body: dict[str, Any] = {"status": {"conditions": [condition]}}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return body


Write = tuple[str, str, str, dict[str, Any], str]
"""(namespace, pod name, resourceVersion the failure was decided on, condition, pod UID)."""


class ConditionWriter:
    """Writes PodScheduled=False on pods that cannot be placed (asynchronous, bounded)."""

    def __init__(self, kube: KubeClient | None, size: int = 5000) -> None:
        self.kube = kube
        self._forbidden = False
        self.written: list[tuple[str, dict[str, Any]]] = []
        """(pod uid, condition), kept when there is no API client (unit tests)."""
        self._worker = (
            Worker("pod-conditions", self._send, self._failed, size) if kube is not None else None
        )

    @property
    def dropped(self) -> int:
        """Writes dropped because the queue was full."""
        return self._worker.dropped if self._worker is not None else 0

    def unschedulable(self, pod: PodInfo, reason: str, message: str) -> None:
        """`pod` (as last seen) could not be placed: `reason` and `message`."""
        condition = scheduled_false(pod.obj, reason, message, api_time())
        if condition is None:
            return
        if self._worker is None:
            self.written.append((pod.uid, condition))
            return
        version = str((pod.obj.get("metadata") or {}).get("resourceVersion") or "")
        self._worker.put((pod.namespace, pod.name, version, condition, pod.uid))

    def stop(self) -> None:
        """Drops the writes not sent yet and ends the thread."""
        if self._worker is not None:
            self._worker.stop(drop_pending=True)

    def _send(self, item: Write) -> None:
        assert self.kube is not None
        namespace, name, version, condition, uid = item
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            self._patch(path, version, condition)
        except KubeError as exc:
            if exc.status != 409 or not version:
                raise
            pod = self.kube.request("GET", path)
            meta = pod.get("metadata") or {}
            if (
                meta.get("uid") != uid
                or (pod.get("spec") or {}).get("nodeName")
                or meta.get("deletionTimestamp")
            ):
                return  # another pod, bound or going since: the condition is not to write
            self._patch(path, str(meta.get("resourceVersion") or ""), condition)

    def _patch(self, path: str, version: str, condition: dict[str, Any]) -> None:
        assert self.kube is not None
        self.kube.request(
            "PATCH",
            f"{path}/status",
            body=status_patch(condition, version),
            content_type=STRATEGIC_MERGE_PATCH,
        )

    def _failed(self, item: Write, exc: Exception) -> None:
        namespace, name = item[0], item[1]
        if not isinstance(exc, KubeError):
            log.error("pod condition not written", exc_info=exc)
        elif exc.status in (404, 409):  # gone, or changed since (bound, updated)
            return
        elif exc.status == 403:
            if not self._forbidden:  # said once: it holds for every pod
                self._forbidden = True
                log.warning(
                    "pod conditions not written: the scheduler's role needs patch on "
                    "pods/status: %s",
                    exc,
                )
        else:
            log.warning("pod condition not written: %s", exc, extra={"pod": f"{namespace}/{name}"})
