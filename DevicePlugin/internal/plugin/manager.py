"""Keeps one registered endpoint per resource, across kubelet restarts.

The kubelet wipes its plugin directory and recreates `kubelet.sock` when it
restarts, forgetting every plugin. The manager polls the identity (device,
inode, ctime) of `kubelet.sock` and of its own sockets every `poll_s`; on a
change it serves every endpoint again on a fresh socket and re-registers it.
New resources (a MIG profile appearing) get an endpoint on the next round;
resources that disappear keep theirs with an empty list, so the kubelet sees
a capacity of 0 rather than a vanished plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from lj_runtimekit.deviceplugin.internal.plugin.server import (
    KUBELET_SOCKET,
    Allocations,
    EndpointError,
    PluginEndpoint,
)
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager

log = logging.getLogger(__name__)

_Identity = tuple[int, int, int]
_RETRY_FIRST_S = 0.1
_RETRY_MAX_S = 1.0


def _identity(path: Path) -> _Identity | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class PluginManager:
    """Serves and registers an endpoint per resource; re-registers after a kubelet restart."""

    def __init__(
        self,
        plugin_dir: Path,
        rm: ResourceManager,
        allocations: Allocations,
        *,
        poll_s: float = 0.1,
        grace_s: float = 2.0,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._rm = rm
        self._allocations = allocations
        self._poll_s = poll_s
        self._grace_s = grace_s
        self.endpoints: dict[str, PluginEndpoint] = {}
        self._registered_with: _Identity | None = None
        self._pending: set[str] = set()
        self._warned_no_kubelet = False
        self._failures: dict[str, tuple[int, float]] = {}
        self.registrations = 0
        """Successful Register calls so far (for tests and metrics)."""

    async def start(self) -> None:
        """Serve every resource of the current inventory (raises EndpointError)."""
        if not self.plugin_dir.is_dir():
            raise EndpointError(
                f"kubelet plugin directory {self.plugin_dir} does not exist"
                " (is this a kubelet node? see --plugin-dir)"
            )
        for resource in sorted(self._rm.resources()):
            await self._serve(resource)

    async def _serve(self, resource: str) -> None:
        endpoint = self.endpoints.get(resource)
        if endpoint is None:
            endpoint = PluginEndpoint(resource, self.plugin_dir, self._rm, self._allocations)
            self.endpoints[resource] = endpoint
        if endpoint.serving:
            await endpoint.stop(0)
        await endpoint.start()
        self._pending.add(resource)

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile until `stop` is set, then stop every endpoint."""
        try:
            while not stop.is_set():
                await self.reconcile()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._poll_s)
        finally:
            await self.stop()

    async def reconcile(self) -> None:
        """One round: new resources, wiped sockets, a new kubelet, pending registrations."""
        for resource in sorted(self._rm.resources()):
            if resource not in self.endpoints:
                log.info("new resource", extra={"resource": resource})
                await self._serve(resource)
        kubelet = _identity(self.kubelet_socket)
        if kubelet is None:
            if not self._warned_no_kubelet:
                self._warned_no_kubelet = True
                log.warning("kubelet socket absent, waiting", extra={"socket": self.kubelet_socket})
            self._registered_with = None
            return
        self._warned_no_kubelet = False
        restarted = kubelet != self._registered_with
        for resource, endpoint in sorted(self.endpoints.items()):
            if (restarted and self._registered_with is not None) or not endpoint.socket_intact():
                await self._serve(resource)
            elif restarted:
                self._pending.add(resource)
        if restarted and self._registered_with is not None:
            log.info("kubelet restarted, registering again", extra={"socket": self.kubelet_socket})
        self._registered_with = kubelet
        now = time.monotonic()
        for resource in sorted(self._pending):
            failures, not_before = self._failures.get(resource, (0, 0.0))
            if restarted:
                failures, not_before = 0, 0.0
            if now < not_before:
                continue
            try:
                await self.endpoints[resource].register(self.kubelet_socket)
            except EndpointError as exc:
                failures += 1
                delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2 ** (failures - 1))
                self._failures[resource] = (failures, time.monotonic() + delay)
                if failures == 1 or failures % 20 == 0:
                    log.warning(
                        "registration failed, retrying",
                        extra={"resource": resource, "failures": failures, "reason": str(exc)},
                    )
                continue
            self._failures.pop(resource, None)
            self._pending.discard(resource)
            self.registrations += 1

    async def stop(self) -> None:
        """Stop every endpoint and remove its socket."""
        await asyncio.gather(*(e.stop(self._grace_s) for e in self.endpoints.values()))
        log.info("endpoints stopped", extra={"endpoints": len(self.endpoints)})
