"""The node's pods: the kubelet first, the API server's watch (when configured) as fallback,
or the watch alone when the kubelet port is not used."""

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


class WatchedPods(PodLister, Protocol):
    """A lister serving a copy kept by a watch, which may be broken while the copy stays."""

    @property
    def problem(self) -> str | None:
        """Why the copy may be stale; None while the watch works."""
        ...

    def stop(self) -> None:
        """End the watch and drop the copy; the next read starts it again."""
        ...


@dataclass(frozen=True)
class PodRead:
    """The outcome of one read: the view (None when no source answered) and the failures."""

    view: PodView | None
    kubelet_up: bool | None
    """None when the kubelet is not used."""
    errors: tuple[tuple[PodSourceName, str], ...] = field(default=())


class NodePods:
    """Reads the node's pods from the kubelet, falling back to the API server's watch; with
    no kubelet (`kubelet` None) from the watch alone. The fallback's watch runs only while
    the kubelet does not answer: it is stopped at the kubelet's first answer and started
    again (a new list) when the kubelet fails again."""

    def __init__(self, kubelet: PodLister | None, fallback: WatchedPods | None = None) -> None:
        if kubelet is None and fallback is None:
            raise ValueError("NodePods needs the kubelet, the API server or both")
        self._kubelet = kubelet
        self._fallback = fallback
        self._falling_back = False

    async def read(self) -> PodRead:
        """Read the pods once; never raises for an unreachable source."""
        errors: list[tuple[PodSourceName, str]] = []
        if self._kubelet is None:
            assert self._fallback is not None
            return await self._read_fallback(self._fallback, None, errors)
        try:
            pods = await self._kubelet.list_pods()
        except PodSourceError as exc:
            errors.append(("kubelet", str(exc)))
        else:
            if self._falling_back and self._fallback is not None:
                self._falling_back = False
                self._fallback.stop()
                log.info("kubelet pods answer again, the API server watch is stopped")
            return PodRead(view=PodView("kubelet", pods), kubelet_up=True)
        if self._fallback is None:
            return PodRead(view=None, kubelet_up=False, errors=tuple(errors))
        if not self._falling_back:
            self._falling_back = True
            log.warning(
                "kubelet pods unavailable, reading pods from the API server by spec.nodeName"
                " while it stays down",
                extra={"reason": errors[0][1]},
            )
        return await self._read_fallback(self._fallback, False, errors)

    @staticmethod
    async def _read_fallback(
        fallback: WatchedPods, kubelet_up: bool | None, errors: list[tuple[PodSourceName, str]]
    ) -> PodRead:
        try:
            pods = await fallback.list_pods()
        except PodSourceError as exc:
            errors.append(("apiserver", str(exc)))
            return PodRead(view=None, kubelet_up=kubelet_up, errors=tuple(errors))
        problem = fallback.problem
        if problem is not None:
            errors.append(("apiserver", problem))
        return PodRead(view=PodView("apiserver", pods), kubelet_up=kubelet_up, errors=tuple(errors))
