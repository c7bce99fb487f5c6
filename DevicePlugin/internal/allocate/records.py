"""Records on pods: `annotations.allocated_devices` (and the bind phase) through the API server.

Writes for one pod are serialised and coalesced: only the newest record is
written, after any write in flight, so a slower early write never overwrites
a later, more complete one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping

from lj_runtimekit.proto.pkg.kube import (
    STRATEGIC_MERGE_PATCH,
    KubeClient,
    KubeError,
    RetryPolicy,
    call_async,
)

log = logging.getLogger(__name__)


class ApiPodRecorder:
    """Merge-patches annotations onto pods, newest first, with bounded retries."""

    def __init__(self, kube: KubeClient, attempts: int = 5) -> None:
        self._kube = kube
        self._retry = RetryPolicy(attempts=attempts, timeout_s=None, max_backoff_s=5.0)
        self._latest: dict[tuple[str, str], dict[str, str]] = {}
        self._writers: dict[tuple[str, str], asyncio.Task[None]] = {}

    def submit(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Write `annotations` on the pod soon (replacing a not yet written record)."""
        key = (namespace, name)
        self._latest[key] = dict(annotations)
        running = self._writers.get(key)
        if running is None or running.done():
            task = asyncio.create_task(self._write(key))
            self._writers[key] = task
            task.add_done_callback(lambda done: self._forget(key, done))

    def _forget(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._writers.get(key) is task:
            del self._writers[key]

    async def _write(self, key: tuple[str, str]) -> None:
        namespace, name = key
        while key in self._latest:
            body = {"metadata": {"annotations": self._latest.pop(key)}}
            path = f"/api/v1/namespaces/{namespace}/pods/{name}"
            try:
                await call_async(
                    f"annotate pod {namespace}/{name}",
                    functools.partial(
                        self._kube.request, "PATCH", path, body, content_type=STRATEGIC_MERGE_PATCH
                    ),
                    self._retry,
                )
            except KubeError as exc:
                log.warning(
                    "pod record not written",
                    extra={"pod": f"{namespace}/{name}", "reason": str(exc)},
                )
                continue
            log.debug("pod record written", extra={"pod": f"{namespace}/{name}"})

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for the writes in flight (at shutdown)."""
        if self._writers:
            await asyncio.wait(set(self._writers.values()), timeout=timeout_s)
