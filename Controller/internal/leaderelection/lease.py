"""Leader election on a coordination.k8s.io/v1 Lease (the client-go algorithm).

Only the holder of the Lease reconciles. A candidate takes the Lease when it is
absent, held by itself, or not renewed within its leaseDurationSeconds; writes
are guarded by resourceVersion, so two candidates never both win. The leader
renews every `retry_period_s`; when it cannot renew within `renew_deadline_s`
it has lost the Lease and must stop (the process exits and is restarted, like
controller-runtime managers do). On a clean stop the Lease is released so the
next replica takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.controller.internal.kube.client import ApiError, Kube

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is and how it is timed."""

    namespace: str
    name: str = "lj-runtimekit-controller"
    identity: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def holder(self) -> str:
        """This candidate's identity (default: host name + pid)."""
        return self.identity or f"{socket.gethostname()}_{os.getpid()}"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _micro(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    text = text.replace("Z", "+00:00")
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


class LeaderElector:
    """Acquire, renew and release one Lease."""

    def __init__(self, kube: Kube, settings: LeaseSettings) -> None:
        self.kube = kube
        self.settings = settings
        self.identity = settings.holder()
        self.lost = asyncio.Event()

    def _path(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    async def _read(self) -> dict[str, Any] | None:
        api = self.kube.coordination
        return await self.kube.maybe(
            f"read lease {self._path()}",
            lambda: api.read_namespaced_lease(
                self.settings.name, self.settings.namespace, _preload_content=False
            ),
        )

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards."""
        api = self.kube.coordination
        now = _now()
        lease = await self._read()
        duration = int(self.settings.lease_duration_s)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": duration,
                    "acquireTime": _micro(now),
                    "renewTime": _micro(now),
                    "leaseTransitions": 0,
                },
            }
            try:
                await self.kube.call(
                    f"create lease {self._path()}",
                    lambda: api.create_namespaced_lease(
                        self.settings.namespace, body, _preload_content=False
                    ),
                )
            except ApiError as exc:
                if exc.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        held_for = float(spec.get("leaseDurationSeconds") or duration)
        expired = renewed is None or (now - renewed).total_seconds() > held_for
        if holder and holder != self.identity and not expired:
            return False
        new_spec = dict(spec)
        new_spec.update(
            holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=_micro(now)
        )
        if holder != self.identity:
            new_spec["acquireTime"] = _micro(now)
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.settings.name,
                "namespace": self.settings.namespace,
                "resourceVersion": lease["metadata"]["resourceVersion"],
            },
            "spec": new_spec,
        }
        try:
            await self.kube.call(
                f"update lease {self._path()}",
                lambda: api.replace_namespaced_lease(
                    self.settings.name, self.settings.namespace, body, _preload_content=False
                ),
            )
        except ApiError as exc:
            if exc.status in (409, 404):
                return False
            raise
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Block until this candidate leads (True) or `stop` is set (False)."""
        _log.info("waiting for leadership", extra={"lease": self._path(), "id": self.identity})
        while not stop.is_set():
            try:
                if await self._try_acquire_or_renew():
                    _log.info("became leader", extra={"lease": self._path(), "id": self.identity})
                    return True
            except ApiError as exc:
                _log.warning("lease not acquired", extra={"lease": self._path(), "error": str(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.retry_period_s)
        return False

    async def renew_forever(self) -> None:
        """Renew until the Lease cannot be renewed within the deadline; then set `lost`."""
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        while True:
            await asyncio.sleep(self.settings.retry_period_s)
            try:
                ok = await asyncio.wait_for(
                    self._try_acquire_or_renew(), self.settings.renew_deadline_s
                )
            except (ApiError, TimeoutError) as exc:
                ok = False
                _log.warning(
                    "lease renewal failed", extra={"lease": self._path(), "error": str(exc)}
                )
            if ok:
                last_ok = loop.time()
            elif loop.time() - last_ok > self.settings.renew_deadline_s:
                _log.error("leadership lost", extra={"lease": self._path(), "id": self.identity})
                self.lost.set()
                return

    async def release(self) -> None:
        """Give the Lease up (best effort) so that another replica takes over at once."""
        api = self.kube.coordination
        try:
            lease = await self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = None
            lease["spec"]["leaseDurationSeconds"] = 1
            await self.kube.call(
                f"release lease {self._path()}",
                lambda: api.replace_namespaced_lease(
                    self.settings.name, self.settings.namespace, lease, _preload_content=False
                ),
            )
            _log.info("leadership released", extra={"lease": self._path()})
        except ApiError as exc:
            _log.warning("lease not released", extra={"lease": self._path(), "error": str(exc)})
