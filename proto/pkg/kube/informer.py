"""Informer: list, then watch from the list's version, list again when that version has
expired (410 Gone); a handler sees every change, in order, from the informer's thread.

A broken list or watch is tried again with exponential backoff (tenacity, with jitter)
until `stop`; a watch the server ended resumes from the last version seen, bookmarks
included. After a list, objects no longer there are handed over as DELETED. `error`
says why the last round failed, until a list or a watch event gets through again.
`stop` ends the open watch at once (its connection is shut down); a stopped informer
is not started again (make a new one).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from lj_runtimekit.proto.pkg.kube.client import KubeClient, KubeObject, WatchCanceller
from lj_runtimekit.proto.pkg.kube.errors import GoneError
from lj_runtimekit.proto.pkg.kube.retry import RetryPolicy, log_retry

log = logging.getLogger(__name__)

Handler = Callable[[str, KubeObject], None]
"""(event type ADDED / MODIFIED / DELETED, object)"""


def _key(obj: KubeObject) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name"))


class Informer:
    """Keeps `handler` in step with a collection (`path`, e.g. /api/v1/pods, narrowed by
    `params` such as a fieldSelector)."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        handler: Handler,
        name: str,
        *,
        params: Mapping[str, str] | None = None,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.kube = kube
        self.path = path
        self.params = dict(params or {})
        self.handler = handler
        self.name = name
        self.synced = threading.Event()
        """Set once the first list has been handed over."""
        self.error: str | None = None
        """Why the last list or watch failed; None again once a list or a watch event (a
        bookmark included) got through."""
        self._backoff = RetryPolicy(
            attempts=None, timeout_s=None, initial_s=initial_backoff_s, max_backoff_s=max_backoff_s
        )
        self._version = ""
        self._known: dict[str, KubeObject] = {}
        self._stop = threading.Event()
        self._canceller = WatchCanceller()
        self._thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> None:
        """Start the informer's thread (a second call does nothing)."""
        if self._thread.ident is None:
            self._thread.start()

    def stop(self) -> None:
        """End the thread: the open watch is cut (a list under way is finished first, its
        objects not handed over)."""
        self._stop.set()
        self._canceller.cancel()

    @property
    def running(self) -> bool:
        """Whether the informer's thread is still there (started and not yet ended)."""
        return self._thread.is_alive()

    def _relist(self) -> None:
        items, self._version = self.kube.list_all(self.path, self.params)
        self.error = None
        fresh = {_key(o): o for o in items}
        for key, old in list(self._known.items()):
            if key not in fresh:
                self._dispatch("DELETED", old)
        for obj in items:
            self._dispatch("MODIFIED" if _key(obj) in self._known else "ADDED", obj)

    def _dispatch(self, etype: str, obj: KubeObject) -> None:
        if self._stop.is_set():
            return
        key = _key(obj)
        if etype == "DELETED":
            self._known.pop(key, None)
        else:
            self._known[key] = obj
        try:
            self.handler(etype, obj)
        except Exception:
            log.exception("informer handler failed", extra={"informer": self.name})

    def _list_and_watch(self) -> None:
        if self._stop.is_set():
            return
        if not self._version:
            self._relist()
            self.synced.set()
        try:
            for etype, obj in self.kube.watch(
                self.path, self._version, self.params, canceller=self._canceller
            ):
                if self._stop.is_set():
                    return
                meta = obj.get("metadata") or {}
                self._version = str(meta.get("resourceVersion") or self._version)
                self.error = None
                if etype != "BOOKMARK":
                    self._dispatch(etype, obj)
        except GoneError:
            self._version = ""  # too old: list again, at once
        except Exception:
            if not self._stop.is_set():
                raise  # else: the watch was cut by `stop`

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _run(self) -> None:
        log_failure = log_retry(f"informer {self.name}: list and watch {self.path}")

        def before_sleep(state: RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome is not None else None
            self.error = str(failure) or type(failure).__name__
            log_failure(state)

        retrying = Retrying(
            retry=retry_if_exception_type(Exception),
            wait=self._backoff.wait(),
            sleep=self._sleep,
            before_sleep=before_sleep,
        )
        while not self._stop.is_set():
            for attempt in retrying:  # each round starts at the initial backoff again
                with attempt:
                    self._list_and_watch()
