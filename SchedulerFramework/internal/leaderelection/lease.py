"""Leader election on a coordination.k8s.io/v1 Lease (client-go's leaderelection).

Acquire: create the Lease, or take it over when its holder has not renewed it
within leaseDurationSeconds. Every write is guarded by the Lease's
resourceVersion, so two candidates never both win. The leader renews every
retry period; when it cannot renew within the renew deadline it stops
leading (the process exits and restarts, as upstream does).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from lj_runtimekit.proto.pkg.kube import KubeClient, KubeError
from lj_runtimekit.schedulerframework.internal.cache.podinfo import KubeObject
from lj_runtimekit.schedulerframework.internal.config.config import LeaderElection

log = logging.getLogger(__name__)


def _micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, kube: KubeClient, config: LeaderElection, identity: str) -> None:
        self.kube = kube
        self.config = config
        self.identity = identity
        self.path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{config.resource_namespace}"
            f"/leases/{config.resource_name}"
        )
        self._observed: tuple[str, float] = ("", 0.0)  # (record, local time first seen)

    def _spec(self, acquire_time: str, transitions: int) -> dict[str, object]:
        now = time.time()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.config.lease_duration_s),
            "acquireTime": acquire_time or _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True while this candidate holds the lease."""
        try:
            lease: KubeObject = self.kube.request("GET", self.path, limited=False, timeout_s=5)
        except KubeError as exc:
            if exc.status != 404:
                log.warning("cannot read the leader lease: %s", exc)
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.config.resource_name,
                    "namespace": self.config.resource_namespace,
                },
                "spec": self._spec("", 0),
            }
            try:
                self.kube.request(
                    "POST", self.path.rsplit("/", 1)[0], body=body, limited=False, timeout_s=5
                )
            except KubeError:
                return False
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = f"{holder}|{spec.get('renewTime')}"
        now = time.monotonic()
        if record != self._observed[0]:
            self._observed = (record, now)
        expired = now - self._observed[1] > float(
            spec.get("leaseDurationSeconds") or self.config.lease_duration_s
        )
        if holder and holder != self.identity and not expired:
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
                log.warning("cannot update the leader lease: %s", exc)
            return False
        return True

    def wait_for_leadership(self, stop: threading.Event) -> bool:
        """Blocks until this candidate leads (True) or `stop` is set (False)."""
        while not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("became leader", extra={"lease": self.path, "identity": self.identity})
                return True
            stop.wait(self.config.retry_period_s)
        return False

    def renew_loop(self, stop: threading.Event, on_lost: threading.Event) -> None:
        """Renews until `stop`; sets `on_lost` when renewal failed for the renew deadline."""
        last_ok = time.monotonic()
        while not stop.wait(self.config.retry_period_s):
            if self.try_acquire_or_renew():
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > self.config.renew_deadline_s:
                log.error("leader lease lost", extra={"lease": self.path})
                on_lost.set()
                return

    def release(self) -> None:
        """Gives the lease up on a clean shutdown so a standby takes over at once."""
        try:
            lease = self.kube.request("GET", self.path, limited=False, timeout_s=5)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec["holderIdentity"] = ""
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = _micro_time(time.time())
            self.kube.request("PUT", self.path, body=lease, limited=False, timeout_s=5)
        except KubeError as exc:
            log.warning("cannot release the leader lease: %s", exc)
