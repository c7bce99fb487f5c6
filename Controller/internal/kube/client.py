"""The Kubernetes API calls of the Controller, on the shared API layer (proto/pkg/kube).

The shared JSON client is synchronous; calls run on a dedicated thread pool sized
to the reconcile workers, and answers are plain JSON dicts (the official client is
not imported: its API and model classes would be most of the Controller's memory).
Transient failures (429, 5xx, no answer) are retried with the shared bounded policy
(`call_async`); 404 reads as "gone"; 409 is ConflictError or AlreadyExistsError (by
the server's reason) for the reconciler to re-read and decide again.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

from lj_runtimekit.proto.pkg.kube import (
    STRATEGIC_MERGE_PATCH,
    ConflictError,
    KubeClient,
    KubeError,
    KubeObject,
    NotFoundError,
    RetryPolicy,
    api_time,
    call_async,
    kube_error,
)

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
Obj = KubeObject
COMPONENT = "lj-runtimekit-controller"
NODE_METADATA_KEPT = ("labels", "annotations")
"""What `node_metadata` keeps of each Node's metadata."""


def _jobs(namespace: str) -> str:
    return f"/apis/batch/v1/namespaces/{quote(namespace)}/jobs"


class Kube:
    """The API calls the reconcilers make."""

    def __init__(
        self,
        client: KubeClient,
        threads: int,
        retry_timeout_s: float = 30.0,
        retry_attempts: int = 8,
        request_timeout_s: float = 30.0,
    ) -> None:
        self.client = client
        self.timeout_s = request_timeout_s
        self.retry = RetryPolicy(attempts=retry_attempts, timeout_s=retry_timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        self.instance = socket.gethostname()
        self._events: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        """Stop the thread pool and close the pooled connections."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    async def call(self, what: str, fn: Callable[[], _T]) -> _T:
        """`fn()` on the thread pool, transient failures retried; a KubeError naming `what`."""
        return await call_async(what, fn, self.retry, executor=self._pool)

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        body: object = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One request (`call`): the answer, read and decoded on the pool; a failure is the
        KubeError of its status, named `what`."""
        timeout_s = self.timeout_s

        def run() -> Obj:
            try:
                return self.client.request(
                    method, path, body, query, content_type, timeout_s, limited=False
                )
            except KubeError as exc:
                raise kube_error(what, exc.status, exc.message, exc.reason) from None

        return await self.call(what, run)

    async def maybe(self, what: str, method: str, path: str, **kw: Any) -> Obj | None:
        """`request`, None on 404."""
        try:
            return await self.request(what, method, path, **kw)
        except NotFoundError:
            return None

    # Nodes

    async def read_node(self, name: str) -> Obj | None:
        """The Node, None when it does not exist."""
        return await self.maybe(f"read node {name}", "GET", f"/api/v1/nodes/{quote(name)}")

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
            "PATCH",
            f"/api/v1/nodes/{quote(name)}",
            body=patch,
            content_type=STRATEGIC_MERGE_PATCH,
        )

    def _node_metadata(self, selector: str, page: int) -> dict[str, Obj]:
        nodes: dict[str, Obj] = {}
        for data in self.client.pages(
            "/api/v1/nodes",
            {"labelSelector": selector},
            page,
            metadata_only=True,
            timeout_s=self.timeout_s,
        ):
            for item in data.get("items") or ():
                meta = item["metadata"]
                nodes[meta["name"]] = {k: meta[k] for k in NODE_METADATA_KEPT if k in meta}
        return nodes

    async def node_metadata(self, selector: str, page: int = 100) -> dict[str, Obj]:
        """Name -> labels and annotations of the Nodes matching `selector`, all the resync
        needs. Listed in pages of metadata only; the rest of each page (managedFields
        above all: most of a Node's metadata) is dropped page by page, so a list of every
        node is never held at once."""
        return await self.call(
            f"list nodes {selector}", lambda: self._node_metadata(selector, page)
        )

    # Jobs and pods

    async def _list(self, kind: str, path: str, namespace: str, selector: str) -> list[Obj]:
        """The objects at `path` matching `selector` (`kind` in `namespace`)."""
        data = await self.request(
            f"list {kind} {namespace} {selector}", "GET", path, query={"labelSelector": selector}
        )
        items: list[Obj] = data.get("items") or []
        return items

    async def list_jobs(self, namespace: str, selector: str) -> list[Obj]:
        """Jobs in `namespace` matching `selector`."""
        return await self._list("jobs", _jobs(namespace), namespace, selector)

    async def create_job(self, manifest: Obj) -> Obj:
        """Create the Job; AlreadyExistsError when one of that name exists."""
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        return await self.request(
            f"create job {namespace}/{name}", "POST", _jobs(namespace), body=manifest
        )

    async def delete_job(self, namespace: str, name: str, uid: str, propagation: str) -> bool:
        """Delete this exact Job (uid precondition); False when it is already gone."""
        body = {"propagationPolicy": propagation, "preconditions": {"uid": uid}}
        try:
            deleted = await self.maybe(
                f"delete job {namespace}/{name}",
                "DELETE",
                f"{_jobs(namespace)}/{quote(name)}",
                body=body,
            )
        except ConflictError:  # a new Job of that name: not ours to delete
            return False
        return deleted is not None

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge annotations into the Job (404 ignored)."""
        await self.maybe(
            f"annotate job {namespace}/{name}",
            "PATCH",
            f"{_jobs(namespace)}/{quote(name)}",
            body={"metadata": {"annotations": annotations}},
            content_type=STRATEGIC_MERGE_PATCH,
        )

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        """Pods in `namespace` matching `selector`."""
        return await self._list(
            "pods", f"/api/v1/namespaces/{quote(namespace)}/pods", namespace, selector
        )

    # Events

    def node_event(self, namespace: str, node: Obj, kind: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about the Node (in `namespace`) in the background, off the
        reconcile's critical path; failures are only logged. The event is built now: a
        queued post keeps the Node's name and uid, not the whole Node (at a burst of
        transitions the posts wait for the API threads, and whole Nodes added up)."""
        meta = node["metadata"]
        name = str(meta["name"])
        stamp = api_time()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": name,
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
        task = asyncio.create_task(self._post_event(namespace, name, reason, body))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def drain_events(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for events still being posted."""
        if self._events:
            await asyncio.wait(list(self._events), timeout=timeout_s)

    async def _post_event(self, namespace: str, node: str, reason: str, body: Obj) -> None:
        try:
            await self.request(
                f"create event for node {node}",
                "POST",
                f"/api/v1/namespaces/{quote(namespace)}/events",
                body=body,
            )
        except KubeError as exc:
            _log.warning(
                "event not posted", extra={"node": node, "reason": reason, "error": str(exc)}
            )
