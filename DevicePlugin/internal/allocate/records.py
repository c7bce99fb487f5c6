"""Records on pods: `annotations.allocated_devices` written through the API server."""

from __future__ import annotations

import asyncio
import logging

from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential

from lj_runtimekit.deviceplugin.internal.kube.client import KubeApi

log = logging.getLogger(__name__)


class ApiPodRecorder:
    """Merge-patches the allocated-devices annotation onto pods, with bounded retries."""

    def __init__(self, api: KubeApi, annotation: str, attempts: int = 5) -> None:
        self._api = api
        self._annotation = annotation
        self._attempts = attempts

    async def record(self, namespace: str, name: str, value: str) -> None:
        """Write `value` under the annotation; log (never raise) when the API server refuses."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential(multiplier=0.2, max=5),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await asyncio.to_thread(
                        self._api.annotate_pod, namespace, name, {self._annotation: value}
                    )
        except Exception as exc:
            log.warning(
                "pod record not written pod=%s/%s annotation=%s reason=%r",
                namespace,
                name,
                self._annotation,
                str(exc),
            )
            return
        log.debug("pod record written pod=%s/%s", namespace, name)
