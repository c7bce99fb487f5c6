"""Background collection: every interval, read the Runtime and the pods, publish a snapshot.

A scrape only yields the latest published families, so a slow or dead Runtime
never delays /metrics. Each source failing is counted, logged when its state
changes (not every interval), and leaves the other sources' series intact.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client.core import Metric

from lj_runtimekit.exporter.internal.allocation.assignments import (
    Allocations,
    pod_allocations,
    with_claims,
)
from lj_runtimekit.exporter.internal.collector.runtime import read_runtime
from lj_runtimekit.exporter.internal.metrics.families import build_families
from lj_runtimekit.exporter.internal.metrics.labels import LabelConfig
from lj_runtimekit.exporter.internal.metrics.registry import ExporterMetrics, status_families
from lj_runtimekit.exporter.internal.metrics.view import RuntimeView
from lj_runtimekit.exporter.internal.metrics.xid import XidCodes
from lj_runtimekit.exporter.internal.pods.podresources import (
    ClaimKey,
    ClaimUser,
    PodResourcesError,
    PodResourcesReader,
)
from lj_runtimekit.exporter.internal.pods.source import NodePods, PodRead
from lj_runtimekit.proto.pkg.featuregate import GateReport, RuntimeTooOldError
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.proto.pkg.runtimeclient import (
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.version import InvalidVersionError

log = logging.getLogger(__name__)

_MAX_LOGGED_PROBLEMS = 1000
"""Remembered annotation problems (each is logged once), bounded against pod churn."""


class CollectionLoop:
    """Collects on an interval and publishes each result to the Exporter's registry."""

    def __init__(
        self,
        *,
        client: RuntimeClient,
        pods: NodePods,
        protocol: Protocol,
        metrics: ExporterMetrics,
        node_name: str,
        interval_s: float,
        component_version: str,
        label_config: LabelConfig,
        pod_resources: PodResourcesReader | None = None,
    ) -> None:
        self._client = client
        self._pods = pods
        self._pod_resources = pod_resources
        self._protocol = protocol
        self._metrics = metrics
        self._node = node_name
        self.interval_s = interval_s
        self._version = component_version
        self._labels = label_config
        self._runtime_up: bool | None = None
        self._kubelet_up: bool | None = None
        self._gate_messages: tuple[str, ...] = ()
        self._last_gates: GateReport | None = None
        self._xids = XidCodes()
        self._container_error: str | None = None
        self._claims_error: str | None = None
        self._pod_resources_error: str | None = None
        self._logged_problems: set[str] = set()
        self.started_at = time.monotonic()
        self.last_completed: float | None = None
        self.collections = 0

    def healthy(self) -> tuple[bool, str]:
        """Whether collection makes progress (the Runtime being down is not unhealthy)."""
        now = time.monotonic()
        allowed = 3 * self.interval_s + 60.0
        last = self.last_completed if self.last_completed is not None else self.started_at
        if now - last > allowed:
            return False, f"no collection finished in the last {now - last:.0f} s"
        return True, f"ok: {self.collections} collections, runtime_up={int(bool(self._runtime_up))}"

    async def run(self, stop: asyncio.Event) -> None:
        """Collect now and then every interval until `stop` is set."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                started = time.monotonic()
                collecting = asyncio.ensure_future(self.collect_once())
                await asyncio.wait({collecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not collecting.done():
                    # Shutting down: do not wait out a slow Runtime.
                    collecting.cancel()
                    await asyncio.gather(collecting, return_exceptions=True)
                    return
                collecting.result()
                delay = max(0.0, self.interval_s - (time.monotonic() - started))
                await asyncio.wait({stopping}, timeout=delay)
        finally:
            stopping.cancel()

    async def collect_once(self) -> None:
        """One collection: read both sources concurrently, then publish."""
        started = time.perf_counter()
        runtime, pod_read = await asyncio.gather(self._read_runtime(), self._pods.read())
        if runtime is not None:
            self._last_gates = runtime.gates
        self._note_pods(pod_read)
        allocations: Allocations | None = None
        if pod_read.view is not None:
            allocations = pod_allocations(pod_read.view.pods, self._protocol.annotations)
            self._note_problems(allocations.problems)
            if runtime is not None and runtime.claims:
                users = await self._claim_users()
                allocations = with_claims(allocations, runtime.claims, users, pod_read.view.pods)
        families: list[Metric] = build_families(
            self._node,
            self._protocol.resources,
            runtime,
            pod_read.view,
            allocations,
            self._xids,
            self._labels,
        )
        families += status_families(
            node=self._node,
            component_version=self._version,
            runtime_up=runtime is not None,
            kubelet_up=pod_read.kubelet_up,
            gates=runtime.gates if runtime else None,
            last_gates=self._last_gates,
            pods_source=pod_read.view.source if pod_read.view else None,
            pods_count=len(pod_read.view.pods) if pod_read.view else 0,
            collected_at_unix=time.time(),
            label_config=self._labels,
        )
        self._metrics.publish(families)
        self._metrics.collection_duration.observe(time.perf_counter() - started)
        self.last_completed = time.monotonic()
        self.collections += 1

    async def _read_runtime(self) -> RuntimeView | None:
        try:
            view = await read_runtime(self._client)
        except RuntimeUnavailableError as exc:
            # A fresh channel next time: gRPC's reconnect back-off would otherwise
            # delay noticing that the Runtime is back by up to two minutes.
            await self._client.close()
            self._runtime_state(False, str(exc))
            return None
        except (RuntimeCallError, RuntimeTooOldError, InvalidVersionError) as exc:
            self._runtime_state(False, str(exc))
            return None
        self._runtime_state(True, f"version={view.version} devices={len(view.devices)}")
        if view.container_error is not None:
            self._metrics.error("runtime")
        if view.container_error != self._container_error:
            self._container_error = view.container_error
            if view.container_error is not None:
                log.warning(
                    "per-container metrics unreadable, container usage series absent",
                    extra={"reason": view.container_error},
                )
        if view.claims_error is not None:
            self._metrics.error("runtime")
        if view.claims_error != self._claims_error:
            self._claims_error = view.claims_error
            if view.claims_error is not None:
                log.warning(
                    "Runtime allocations unreadable, DRA claims not attributed",
                    extra={"reason": view.claims_error},
                )
        if view.gates.messages != self._gate_messages:
            self._gate_messages = view.gates.messages
            for message in view.gates.messages:
                log.warning(
                    "feature gate off", extra={"runtime_version": view.version, "reason": message}
                )
        return view

    async def _claim_users(self) -> dict[ClaimKey, tuple[ClaimUser, ...]]:
        """Who uses the Runtime's DRA claims (PodResources); none while it does not answer,
        or when it is not read (`--pod-resources-socket ""`)."""
        if self._pod_resources is None:
            return {}
        users: dict[ClaimKey, tuple[ClaimUser, ...]] = {}
        error: str | None = None
        try:
            users = await self._pod_resources.claim_users()
        except PodResourcesError as exc:
            error = str(exc)
        if error is not None:
            self._metrics.error("podresources")
        if error != self._pod_resources_error:
            self._pod_resources_error = error
            if error is None:
                log.info("PodResources readable, DRA claims attributed to their containers")
            else:
                log.warning(
                    "PodResources unreadable, DRA claims' container series absent",
                    extra={"reason": error},
                )
        return users

    def _runtime_state(self, up: bool, detail: str) -> None:
        if not up:
            self._metrics.error("runtime")
        if up == self._runtime_up:
            return
        self._runtime_up = up
        if up:
            log.info("runtime readable", extra={"detail": detail})
        else:
            log.warning(
                "runtime unreadable, device series absent until it answers",
                extra={"reason": detail},
            )

    def _note_pods(self, read: PodRead) -> None:
        for source, _ in read.errors:
            self._metrics.error(source)
        if read.kubelet_up is None or read.kubelet_up == self._kubelet_up:
            return
        self._kubelet_up = read.kubelet_up
        if read.kubelet_up:
            log.info(
                "kubelet pods readable", extra={"pods": len(read.view.pods) if read.view else 0}
            )
        else:
            reason = read.errors[0][1] if read.errors else "unknown"
            log.warning("kubelet pods unreadable", extra={"reason": reason})

    def _note_problems(self, problems: tuple[str, ...]) -> None:
        if problems:
            self._metrics.error("annotations", len(problems))
        if len(self._logged_problems) > _MAX_LOGGED_PROBLEMS:
            self._logged_problems.clear()
        for problem in problems:
            if problem not in self._logged_problems:
                self._logged_problems.add(problem)
                log.warning("assignment annotation ignored", extra={"problem": problem})
