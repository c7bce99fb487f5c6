"""Leader election on a coordination.k8s.io/v1 Lease: client-go's algorithm.

A candidate takes the Lease when it is absent, released (no holder), its own,
or expired. Expiry is timed on this candidate's monotonic clock from the moment
it *observed* the Lease record change, never from the holder's `renewTime`: a
holder whose clock runs behind keeps its Lease as long as it keeps renewing.
Every write carries the resourceVersion it read, so two candidates never both
win. The leader renews every `retry_period_s`; it has lost the Lease when it
cannot renew within `renew_deadline_s`, or at once when a read shows another
holder. A clean stop releases the Lease so that a standby takes over at once.

The official client ships this algorithm only with a ConfigMap lock and times
it on the wall clock; this module keeps one implementation for the components,
on the Lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lj_runtimekit.proto.pkg.kube import KubeClient, KubeError, KubeObject, micro_time

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    """Where the Lease is, who this candidate is, and how the election is timed."""

    namespace: str
    name: str
    identity: str = ""
    """This candidate's holder identity; default: host name and process id."""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def holder(self) -> str:
        """The identity written into the Lease."""
        return self.identity or f"{socket.gethostname()}_{os.getpid()}"


class LeaderElector:
    """Acquires, renews and releases one Lease (blocking calls; async drivers below)."""

    def __init__(
        self,
        kube: KubeClient,
        config: LeaseConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.config = config
        self.identity = config.holder()
        self.path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{config.namespace}/leases/{config.name}"
        )
        self.other_holder = ""
        """The other candidate the last read found holding the Lease ("" when none)."""
        self._clock = clock
        self._observed: tuple[str, float] = ("", 0.0)  # (record, local time first seen)

    def _spec(self, acquire_time: str, transitions: int) -> dict[str, object]:
        now = time.time()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.config.lease_duration_s),
            "acquireTime": acquire_time or micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    def _create(self) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.config.name, "namespace": self.config.namespace},
            "spec": self._spec("", 0),
        }
        try:
            self.kube.request(
                "POST", self.path.rsplit("/", 1)[0], body=body, limited=False, timeout_s=5
            )
        except KubeError as exc:
            if exc.status != 409:
                log.warning(
                    "leader lease not created", extra={"lease": self.path, "error": str(exc)}
                )
            return False
        return True

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True while this candidate holds the Lease."""
        try:
            lease: KubeObject = self.kube.request("GET", self.path, limited=False, timeout_s=5)
        except KubeError as exc:
            if exc.status == 404:
                return self._create()
            log.warning("leader lease not read", extra={"lease": self.path, "error": str(exc)})
            return False
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = f"{holder}|{spec.get('renewTime')}|{spec.get('leaseTransitions')}"
        now = self._clock()
        if record != self._observed[0]:
            self._observed = (record, now)
        duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration_s)
        expired = now - self._observed[1] > duration
        self.other_holder = holder if holder != self.identity else ""
        if self.other_holder and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire = str(spec.get("acquireTime") or "") if holder == self.identity else ""
        if holder != self.identity:
            transitions += 1
        lease["spec"] = self._spec(acquire, transitions)
        try:
            self.kube.request("PUT", self.path, body=lease, limited=False, timeout_s=5)
        except KubeError as exc:
            if exc.status != 409:
                log.warning(
                    "leader lease not updated", extra={"lease": self.path, "error": str(exc)}
                )
            return False
        self.other_holder = ""
        return True

    def release(self) -> None:
        """Give the Lease up (best effort) on a clean stop, so that a standby leads at once."""
        try:
            lease = self.kube.request("GET", self.path, limited=False, timeout_s=5)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec["holderIdentity"] = ""
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = micro_time(time.time())
            self.kube.request("PUT", self.path, body=lease, limited=False, timeout_s=5)
            log.info("leadership released", extra={"lease": self.path, "identity": self.identity})
        except KubeError as exc:
            log.warning("leader lease not released", extra={"lease": self.path, "error": str(exc)})

    def _lost(self, last_ok: float) -> bool:
        """After a failed renewal: has the Lease been lost?"""
        if self.other_holder:
            log.error(
                "leader lease taken over",
                extra={"lease": self.path, "identity": self.identity, "holder": self.other_holder},
            )
            return True
        if self._clock() - last_ok > self.config.renew_deadline_s:
            log.error("leader lease not renewed in time", extra={"lease": self.path})
            return True
        return False

    # -- thread drivers ----------------------------------------------------------------------

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or `stop` is set (False)."""
        log.info("waiting for leadership", extra={"lease": self.path, "identity": self.identity})
        while not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("became leader", extra={"lease": self.path, "identity": self.identity})
                return True
            stop.wait(self.config.retry_period_s)
        return False

    def renew_until_lost(self, stop: threading.Event) -> bool:
        """Renew every retry period until `stop` (False) or the Lease is lost (True)."""
        last_ok = self._clock()
        while not stop.wait(self.config.retry_period_s):
            if self.try_acquire_or_renew():
                last_ok = self._clock()
            elif self._lost(last_ok):
                return True
        return False

    # -- asyncio drivers (each attempt runs in a worker thread) ---------------------------------

    async def acquire_async(self, stop: asyncio.Event) -> bool:
        """`acquire` for an event loop."""
        log.info("waiting for leadership", extra={"lease": self.path, "identity": self.identity})
        while not stop.is_set():
            if await asyncio.to_thread(self.try_acquire_or_renew):
                log.info("became leader", extra={"lease": self.path, "identity": self.identity})
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.retry_period_s)
        return False

    async def renew_until_lost_async(self) -> None:
        """Renew every retry period; return once the Lease is lost."""
        last_ok = self._clock()
        while True:
            await asyncio.sleep(self.config.retry_period_s)
            if await asyncio.to_thread(self.try_acquire_or_renew):
                last_ok = self._clock()
            elif self._lost(last_ok):
                return

    async def release_async(self) -> None:
        """`release` for an event loop."""
        await asyncio.to_thread(self.release)
