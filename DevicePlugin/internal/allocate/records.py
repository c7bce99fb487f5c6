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
from typing import Protocol as TypingProtocol

from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held, Ledger
from lj_runtimekit.deviceplugin.internal.allocate.resolve import device_containers
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import PodInfo
from lj_runtimekit.proto.pkg.kube import (
    STRATEGIC_MERGE_PATCH,
    KubeClient,
    KubeError,
    RetryPolicy,
    call_async,
)
from lj_runtimekit.proto.pkg.protocol import BIND_PHASE_ALLOCATED, Protocol, encode_assignment

log = logging.getLogger(__name__)


class PodRecorder(TypingProtocol):
    """Writes records on pods (Kubernetes API; absent without access)."""

    def submit(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge these annotations onto the pod soon, newest record winning."""

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for writes in flight."""


def pod_record(
    pod: PodInfo, held: Mapping[str, Held], served: Mapping[str, object], protocol: Protocol
) -> dict[str, str] | None:
    """The annotations recording what `held` (container -> allocation) gives the pod, with
    `bind_phase: allocated` once every device container of `served` resources got all of
    them; None when the pod already carries them."""
    ann = protocol.annotations
    value = encode_assignment({c: h.shares for c, h in held.items()})
    complete = all(
        c in held and r in held[c].called for c, r in device_containers(pod, served.__contains__)
    )
    annotations = {ann.allocated_devices: value}
    if complete:
        annotations[ann.bind_phase] = BIND_PHASE_ALLOCATED
    if all(pod.annotations.get(k) == v for k, v in annotations.items()):
        return None
    return annotations


def record(
    recorder: PodRecorder | None,
    pod: PodInfo,
    ledger: Ledger,
    served: Mapping[str, object],
    protocol: Protocol,
) -> None:
    """Submit the pod's record when it changed (nothing without a recorder)."""
    if recorder is None:
        return
    annotations = pod_record(pod, ledger.of_pod(pod.uid), served, protocol)
    if annotations is not None:
        recorder.submit(pod.namespace, pod.name, annotations)


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
