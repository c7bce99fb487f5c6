"""Informer: list, then watch, re-list on expiry; calls a handler per change, in order."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from lj_runtimekit.schedulerframework.internal.cache.podinfo import KubeObject
from lj_runtimekit.schedulerframework.internal.kube.client import Kube, KubeError

log = logging.getLogger(__name__)

Handler = Callable[[str, KubeObject], None]
"""(event type ADDED / MODIFIED / DELETED, object)"""


def _key(obj: KubeObject) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name"))


class Informer:
    """Keeps `handler` in step with a collection (`path`, e.g. /api/v1/pods)."""

    def __init__(self, kube: Kube, path: str, handler: Handler, name: str) -> None:
        self.kube = kube
        self.path = path
        self.handler = handler
        self.name = name
        self.synced = threading.Event()
        self._known: dict[str, KubeObject] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _relist(self) -> str:
        items, rv = self.kube.list_all(self.path)
        fresh = {_key(o): o for o in items}
        for key, old in list(self._known.items()):
            if key not in fresh:
                self._dispatch("DELETED", old)
        for obj in items:
            self._dispatch("MODIFIED" if _key(obj) in self._known else "ADDED", obj)
        return rv

    def _dispatch(self, etype: str, obj: KubeObject) -> None:
        key = _key(obj)
        if etype == "DELETED":
            self._known.pop(key, None)
        else:
            self._known[key] = obj
        try:
            self.handler(etype, obj)
        except Exception:
            log.exception("informer handler failed", extra={"informer": self.name})

    def _run(self) -> None:
        rv = ""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._relist()
                    self.synced.set()
                for etype, obj in self.kube.watch(self.path, rv):
                    if self._stop.is_set():
                        return
                    meta = obj.get("metadata") or {}
                    rv = str(meta.get("resourceVersion") or rv)
                    if etype == "BOOKMARK":
                        continue
                    self._dispatch(etype, obj)
                backoff = 0.5
            except KubeError as exc:
                if exc.status == 410:
                    rv = ""  # too old: list again
                    continue
                log.warning("watch failed, retrying: %s", exc, extra={"informer": self.name})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:
                log.warning("watch broke, retrying: %s", exc, extra={"informer": self.name})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
