"""Garbage collection: the Runtime allocations of pods whose containers are gone.

A pod's allocations are released once it finished (Succeeded/Failed), or it
left the pod list: at once when the list is the API server's, after the
release grace when it is the kubelet's (empty for a moment while the kubelet
restarts). A pod being deleted keeps its devices until then: its containers
still run their grace period.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held, Ledger
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import TERMINAL_PHASES, PodInfo
from lj_runtimekit.deviceplugin.internal.rm.manager import RuntimeAccess
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeCallError, RuntimeUnavailableError

log = logging.getLogger(__name__)


class Collector:
    """Releases what finished or vanished pods hold, in the Runtime and the ledger."""

    def __init__(self, ledger: Ledger, runtime: RuntimeAccess, release_grace_s: float) -> None:
        self._ledger = ledger
        self._runtime = runtime
        self._release_grace_s = release_grace_s

    async def release_finished(self, pods: Sequence[PodInfo], *, fresh: bool) -> None:
        """Release the allocations of pods in `pods` that finished or are missing from it
        (`fresh`: the API server's list, so missing means gone)."""
        by_uid: Mapping[str, PodInfo] = {p.uid: p for p in pods}
        now = time.monotonic()
        for held in list(self._ledger.entries.values()):
            pod = by_uid.get(held.pod_uid)
            if pod is not None and pod.phase not in TERMINAL_PHASES:
                held.missing_since = None
                continue
            if pod is None and not fresh:
                if held.missing_since is None:
                    held.missing_since = now
                if now - held.missing_since < self._release_grace_s:
                    continue
            await self.release(held)

    async def release(self, held: Held) -> None:
        """Release one container's allocation; kept in the ledger when the Runtime fails."""
        try:
            released = await self._runtime.client.release(held.key)
        except (RuntimeCallError, RuntimeUnavailableError) as exc:
            log.warning("release failed", extra={"container": held.key, "reason": str(exc)})
            return
        self._ledger.entries.pop(held.key, None)
        log.info(
            "released",
            extra={
                "pod": f"{held.namespace}/{held.name}",
                "container": held.container,
                "released": released,
            },
        )
