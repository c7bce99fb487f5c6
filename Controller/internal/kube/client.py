"""The Kubernetes API calls of the Controller, with bounded retries of transient failures.

The official client is synchronous; calls run on a dedicated thread pool sized
to the reconcile workers. Responses are parsed as plain JSON dicts (the
client's model classes are slow to build and not needed). 429, 5xx and
connection failures are retried with exponential backoff (tenacity) for a
bounded time; 404 reads as "gone"; 409 is raised as ConflictError or
AlreadyExistsError for the reconciler to re-read and decide again.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
Obj = dict[str, Any]
COMPONENT = "lj-runtimekit-controller"


def now_rfc3339() -> str:
    """Current UTC time, RFC 3339 with seconds."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ConflictError(RuntimeError):
    """409: the object changed since it was read (optimistic concurrency)."""


class AlreadyExistsError(RuntimeError):
    """409 AlreadyExists on create."""


class ApiError(RuntimeError):
    """A non-transient API failure (or a transient one that outlasted the retries)."""

    def __init__(self, what: str, status: int | None, detail: str) -> None:
        super().__init__(f"{what}: {status or 'no answer'}: {detail}")
        self.status = status


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504) or exc.status == 0
    return isinstance(
        exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError | socket.timeout
    )


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.reason)
    return str(body.get("message") or exc.reason)


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("reason", ""))
    except ValueError:
        return ""


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
        self.coordination = k8s.CoordinationV1Api(api)
        self.retry_timeout_s = retry_timeout_s
        self.retry_attempts = retry_attempts
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        self.instance = socket.gethostname()
        self._events: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        """Stop the thread pool and close the connection pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.api.close()

    async def call(self, what: str, fn: Callable[[], _T]) -> _T:
        loop = asyncio.get_running_loop()
        retrying = AsyncRetrying(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(self.retry_attempts) | stop_after_delay(self.retry_timeout_s),
            wait=wait_exponential_jitter(initial=0.2, max=5.0),
            before_sleep=before_sleep_log(_log, logging.WARNING),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await loop.run_in_executor(self._pool, fn)
        except ApiException as exc:
            raise ApiError(what, exc.status, _message(exc)) from exc
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            raise ApiError(what, None, str(exc)) from exc
        raise AssertionError("unreachable: tenacity returns or raises")

    @staticmethod
    def _json(response: Any) -> Obj:
        data: Obj = json.loads(response.data or b"{}")
        return data

    async def maybe(self, what: str, fn: Callable[[], Any]) -> Obj | None:
        """Call returning the parsed object, None on 404."""
        try:
            return self._json(await self.call(what, fn))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

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
        """Patch the Node (strategic merge: maps merge, null removes a key).

        With `resource_version`, only if the Node is unchanged (else ConflictError).
        """
        if resource_version is not None:
            patch = {
                **patch,
                "metadata": {**patch["metadata"], "resourceVersion": resource_version},
            }
        try:
            return await self.maybe(
                f"patch node {name}",
                lambda: self.core.patch_node(
                    name, patch, _preload_content=False, _request_timeout=self.timeout
                ),
            )
        except ApiError as exc:
            if exc.status == 409:
                raise ConflictError(f"node {name} changed while being reconciled") from exc
            raise

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

    async def list_jobs(self, namespace: str, selector: str) -> list[Obj]:
        """Jobs in `namespace` matching `selector`."""
        data = self._json(
            await self.call(
                f"list jobs {namespace} {selector}",
                lambda: self.batch.list_namespaced_job(
                    namespace,
                    label_selector=selector,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                ),
            )
        )
        items: list[Obj] = data.get("items", [])
        return items

    async def create_job(self, manifest: Obj) -> Obj:
        """Create the Job; AlreadyExistsError when one of that name exists."""
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        try:
            return self._json(
                await self.call(
                    f"create job {namespace}/{name}",
                    lambda: self.batch.create_namespaced_job(
                        namespace,
                        manifest,
                        _preload_content=False,
                        _request_timeout=self.timeout,
                    ),
                )
            )
        except ApiError as exc:
            if exc.status == 409:
                raise AlreadyExistsError(f"job {namespace}/{name} already exists") from exc
            raise

    async def delete_job(self, namespace: str, name: str, uid: str, propagation: str) -> bool:
        """Delete this exact Job (uid precondition); False when it is already gone."""
        body = k8s.V1DeleteOptions(
            propagation_policy=propagation, preconditions=k8s.V1Preconditions(uid=uid)
        )
        try:
            await self.call(
                f"delete job {namespace}/{name}",
                lambda: self.batch.delete_namespaced_job(
                    name,
                    namespace,
                    body=body,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                ),
            )
        except ApiError as exc:
            if exc.status in (404, 409):  # gone, or a new Job of that name (not ours to delete)
                return False
            raise
        return True

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
        data = self._json(
            await self.call(
                f"list pods {namespace} {selector}",
                lambda: self.core.list_namespaced_pod(
                    namespace,
                    label_selector=selector,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                ),
            )
        )
        items: list[Obj] = data.get("items", [])
        return items

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
        stamp = now_rfc3339()
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
            await self.call(
                f"create event for node {meta['name']}",
                lambda: self.core.create_namespaced_event(
                    namespace, body, _preload_content=False, _request_timeout=self.timeout
                ),
            )
        except ApiError as exc:
            _log.warning(
                "event not posted",
                extra={"node": meta["name"], "reason": reason, "error": str(exc)},
            )
