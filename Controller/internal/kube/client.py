"""The Kubernetes API calls of the Controller, on the shared API layer (proto/pkg/kube).

The official client is synchronous; calls run on a dedicated thread pool sized
to the reconcile workers. Responses are read there and parsed as plain JSON
dicts (the client's model classes are slow to build and not needed). Failures are the
shared KubeError types and transient ones (429, 5xx, no answer) are retried
with the shared bounded policy (`call_async`); 404 reads as "gone"; 409 is
ConflictError or AlreadyExistsError (by the server's reason) for the
reconciler to re-read and decide again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes import client as k8s

from lj_runtimekit.proto.pkg.kube import (
    ConflictError,
    KubeError,
    KubeObject,
    NotFoundError,
    RetryPolicy,
    api_time,
    call_async,
)

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
Obj = KubeObject
COMPONENT = "lj-runtimekit-controller"


class Kube:
    """The API calls the reconcilers make."""

    def __init__(
        self,
        api: k8s.ApiClient,
        threads: int,
        retry_timeout_s: float = 30.0,
        retry_attempts: int = 8,
        request_timeout_s: float = 30.0,
    ) -> None:
        self.api = api
        self.timeout = (min(5.0, request_timeout_s), request_timeout_s)
        self.core = k8s.CoreV1Api(api)
        self.batch = k8s.BatchV1Api(api)
        self.retry = RetryPolicy(attempts=retry_attempts, timeout_s=retry_timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        self.instance = socket.gethostname()
        self._events: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        """Stop the thread pool and close the connection pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.api.close()

    async def call(self, what: str, fn: Callable[[], _T]) -> _T:
        """`fn()` on the thread pool, transient failures retried; a KubeError naming `what`."""
        return await call_async(what, fn, self.retry, executor=self._pool)

    @staticmethod
    def _json(response: Any) -> Obj:
        data: Obj = json.loads(response.data or b"{}")
        return data

    async def call_json(self, what: str, fn: Callable[[], Any]) -> Obj:
        """`call` of a typed API method (`_preload_content=False`): the answer read and parsed
        on the pool, which also hands its connection back."""
        return await self.call(what, lambda: self._json(fn()))

    async def maybe(self, what: str, fn: Callable[[], Any]) -> Obj | None:
        """`call_json`, None on 404."""
        try:
            return await self.call_json(what, fn)
        except NotFoundError:
            return None

    # Nodes

    async def read_node(self, name: str) -> Obj | None:
        """The Node, None when it does not exist."""
        return await self.maybe(
            f"read node {name}",
            lambda: self.core.read_node(
                name, _preload_content=False, _request_timeout=self.timeout
            ),
        )

    async def patch_node(self, name: str, patch: Obj, resource_version: str | None) -> Obj | None:
        """Patch the Node (strategic merge: maps merge, null removes a key); None when it
        does not exist.

        With `resource_version`, only if the Node is unchanged (else ConflictError).
        """
        if resource_version is not None:
            patch = {
                **patch,
                "metadata": {**patch["metadata"], "resourceVersion": resource_version},
            }
        return await self.maybe(
            f"patch node {name}",
            lambda: self.core.patch_node(
                name, patch, _preload_content=False, _request_timeout=self.timeout
            ),
        )

    def iter_nodes(self, selector: str, page: int = 500) -> Iterator[Obj]:
        """Every Node matching `selector`, listed in pages (blocking; call from a thread)."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"label_selector": selector, "limit": page}
            if token:
                kwargs["_continue"] = token
            response = self.core.list_node(
                _preload_content=False, _request_timeout=self.timeout, **kwargs
            )
            data = self._json(response)
            yield from data.get("items", [])
            token = data.get("metadata", {}).get("continue")
            if not token:
                return

    async def node_metadata(self, selector: str) -> dict[str, Obj]:
        """Name -> metadata of the Nodes matching `selector` (the rest is dropped per page)."""
        return await self.call(
            f"list nodes {selector}",
            lambda: {n["metadata"]["name"]: n["metadata"] for n in self.iter_nodes(selector)},
        )

    # Jobs and pods

    async def _list(
        self, kind: str, method: Callable[..., Any], namespace: str, selector: str
    ) -> list[Obj]:
        """The `kind` objects in `namespace` matching `selector` (`method` lists them)."""
        data = await self.call_json(
            f"list {kind} {namespace} {selector}",
            lambda: method(
                namespace,
                label_selector=selector,
                _preload_content=False,
                _request_timeout=self.timeout,
            ),
        )
        items: list[Obj] = data.get("items", [])
        return items

    async def list_jobs(self, namespace: str, selector: str) -> list[Obj]:
        """Jobs in `namespace` matching `selector`."""
        return await self._list("jobs", self.batch.list_namespaced_job, namespace, selector)

    async def create_job(self, manifest: Obj) -> Obj:
        """Create the Job; AlreadyExistsError when one of that name exists."""
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        return await self.call_json(
            f"create job {namespace}/{name}",
            lambda: self.batch.create_namespaced_job(
                namespace,
                manifest,
                _preload_content=False,
                _request_timeout=self.timeout,
            ),
        )

    async def delete_job(self, namespace: str, name: str, uid: str, propagation: str) -> bool:
        """Delete this exact Job (uid precondition); False when it is already gone."""
        body = k8s.V1DeleteOptions(
            propagation_policy=propagation, preconditions=k8s.V1Preconditions(uid=uid)
        )
        try:
            deleted = await self.maybe(
                f"delete job {namespace}/{name}",
                lambda: self.batch.delete_namespaced_job(
                    name,
                    namespace,
                    body=body,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                ),
            )
        except ConflictError:  # a new Job of that name: not ours to delete
            return False
        return deleted is not None

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge annotations into the Job (404 ignored)."""
        await self.maybe(
            f"annotate job {namespace}/{name}",
            lambda: self.batch.patch_namespaced_job(
                name,
                namespace,
                {"metadata": {"annotations": annotations}},
                _preload_content=False,
                _request_timeout=self.timeout,
            ),
        )

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        """Pods in `namespace` matching `selector`."""
        return await self._list("pods", self.core.list_namespaced_pod, namespace, selector)

    # Events

    def node_event(self, namespace: str, node: Obj, kind: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about the Node (in `namespace`) in the background, off the
        reconcile's critical path; failures are only logged."""
        task = asyncio.create_task(self._post_event(namespace, node, kind, reason, message))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def drain_events(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for events still being posted."""
        if self._events:
            await asyncio.wait(list(self._events), timeout=timeout_s)

    async def _post_event(
        self, namespace: str, node: Obj, kind: str, reason: str, message: str
    ) -> None:
        meta = node["metadata"]
        stamp = api_time()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": meta["name"],
                "uid": meta.get("uid", ""),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.call_json(
                f"create event for node {meta['name']}",
                lambda: self.core.create_namespaced_event(
                    namespace, body, _preload_content=False, _request_timeout=self.timeout
                ),
            )
        except KubeError as exc:
            _log.warning(
                "event not posted",
                extra={"node": meta["name"], "reason": reason, "error": str(exc)},
            )
