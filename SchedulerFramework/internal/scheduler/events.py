"""Event recorder: asynchronous, rate limited, repeated events aggregated into a count.

Like client-go's recorder: a bounded queue drained by a few threads (one pod's
events all by the same one, in order); an event
equal to one already sent for the same pod (reason and message) bumps that
event's count instead of creating another object. When the queue is full
events are dropped (and counted), never blocking scheduling.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.proto.pkg.kube import MERGE_PATCH, KubeClient, KubeError, api_time
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.scheduler.worker import Worker

log = logging.getLogger(__name__)

SENDERS = 4
"""Events in flight at once: one sender fell seconds behind the binds in a burst (each
write waits for the API server); a pod's events keep one sender, so they stay in order."""


@dataclass(frozen=True)
class EventRecord:
    namespace: str
    name: str
    uid: str
    kind: str
    reason: str
    message: str


def event_body(
    r: EventRecord, name: str, now: str, component: str, instance: str
) -> dict[str, Any]:
    """The core/v1 Event object `name` for `r`, first seen `now` (an API time)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": r.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": r.namespace,
            "name": r.name,
            "uid": r.uid,
        },
        "reason": r.reason,
        "message": r.message[:1024],
        "type": r.kind,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
    }


class EventRecorder:
    def __init__(
        self, kube: KubeClient | None, component: str, instance: str, size: int = 5000
    ) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance
        self._sent: OrderedDict[tuple[str, str, str], tuple[str, int]] = OrderedDict()
        self.recorded: list[EventRecord] = []
        """Kept when there is no API client (unit tests)."""
        self._sent_lock = threading.Lock()
        self._worker = (
            Worker(
                "event-recorder",
                self._send,
                self._failed,
                size,
                threads=SENDERS,
                key=lambda r: r.uid,
            )
            if kube is not None
            else None
        )

    @property
    def dropped(self) -> int:
        """Events dropped because the queue was full."""
        return self._worker.dropped if self._worker is not None else 0

    def event(self, pod: PodInfo, kind: str, reason: str, message: str) -> None:
        record = EventRecord(pod.namespace, pod.name, pod.uid, kind, reason, message)
        if self._worker is None:
            self.recorded.append(record)
            return
        self._worker.put(record)

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()

    def _failed(self, record: EventRecord, exc: Exception) -> None:
        if not isinstance(exc, KubeError):
            log.error("event not recorded", exc_info=exc)
        elif exc.status != 404:  # the pod's namespace is gone
            log.warning(
                "event not recorded: %s", exc, extra={"pod": f"{record.namespace}/{record.name}"}
            )

    def _send(self, r: EventRecord) -> None:
        assert self.kube is not None
        key = (r.uid, r.reason, r.message)
        now = api_time()
        with self._sent_lock:
            previous = self._sent.get(key)
        base = f"/api/v1/namespaces/{r.namespace}/events"
        if previous is not None:
            name, count = previous
            try:
                self.kube.request(
                    "PATCH",
                    f"{base}/{name}",
                    body={"count": count + 1, "lastTimestamp": now},
                    content_type=MERGE_PATCH,
                )
                with self._sent_lock:
                    self._sent[key] = (name, count + 1)
                    self._sent.move_to_end(key)
                return
            except KubeError as exc:
                if exc.status != 404:
                    raise
        name = f"{r.name}.{time.time_ns():x}"
        self.kube.request(
            "POST", base, body=event_body(r, name, now, self.component, self.instance)
        )
        with self._sent_lock:  # the senders share it (each key is one sender's)
            self._sent[key] = (name, 1)
            if len(self._sent) > 20000:
                self._sent.popitem(last=False)
