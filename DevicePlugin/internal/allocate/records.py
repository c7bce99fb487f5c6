"""Records on pods: `annotations.allocated_devices` (and the bind phase) through the API server.

Writes for one pod are serialised and coalesced: only the newest record is
written, after any write in flight, so a slower early write never overwrites
a later, more complete one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential

from lj_runtimekit.deviceplugin.internal.kube.client import KubeApi

log = logging.getLogger(__name__)


class ApiPodRecorder:
    """Merge-patches annotations onto pods, newest first, with bounded retries."""

    def __init__(self, api: KubeApi, attempts: int = 5) -> None:
        self._api = api
        self._attempts = attempts
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
            annotations = self._latest.pop(key)
            retrying = AsyncRetrying(
                stop=stop_after_attempt(self._attempts),
                wait=wait_exponential(multiplier=0.2, max=5),
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await asyncio.to_thread(
                            self._api.annotate_pod, namespace, name, annotations
                        )
            except Exception as exc:
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
