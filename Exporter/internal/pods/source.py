"""The node's pods: the kubelet first, the API server (when configured) as fallback."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from lj_runtimekit.exporter.internal.pods.kubelet import PodSourceError
from lj_runtimekit.exporter.internal.pods.model import Pod, PodSourceName, PodView

log = logging.getLogger(__name__)


class PodLister(Protocol):
    """Something that lists the node's pods (kubelet or API server)."""

    async def list_pods(self) -> tuple[Pod, ...]:
        """The node's pods; raise PodSourceError when they cannot be read."""
        ...


@dataclass(frozen=True)
class PodRead:
    """The outcome of one read: the view (None when no source answered) and the failures."""

    view: PodView | None
    kubelet_up: bool
    errors: tuple[tuple[PodSourceName, str], ...] = field(default=())


class NodePods:
    """Reads the node's pods from the kubelet, falling back to the API server."""

    def __init__(self, kubelet: PodLister, fallback: PodLister | None = None) -> None:
        self._kubelet = kubelet
        self._fallback = fallback
        self._fallback_logged = False

    async def read(self) -> PodRead:
        """Read the pods once; never raises for an unreachable source."""
        try:
            pods = await self._kubelet.list_pods()
        except PodSourceError as exc:
            errors: list[tuple[PodSourceName, str]] = [("kubelet", str(exc))]
        else:
            return PodRead(view=PodView("kubelet", pods), kubelet_up=True)
        if self._fallback is None:
            return PodRead(view=None, kubelet_up=False, errors=tuple(errors))
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning(
                "kubelet pods unavailable, reading pods from the API server by spec.nodeName"
                " while it stays down (logged once)",
                extra={"reason": errors[0][1]},
            )
        try:
            pods = await self._fallback.list_pods()
        except PodSourceError as exc:
            errors.append(("apiserver", str(exc)))
            return PodRead(view=None, kubelet_up=False, errors=tuple(errors))
        return PodRead(view=PodView("apiserver", pods), kubelet_up=False, errors=tuple(errors))
