"""API errors: one type with the HTTP status and the API server's message, mapped once.

Every failure of a call to the API server becomes a KubeError: an answer other
than 2xx (also the official client's ApiException) with the status and the message
of the server's Status object, or no answer at all (urllib3 and socket errors)
with status 0. The statuses callers act on have their own subclasses.
"""

from __future__ import annotations

import json
import sys

import urllib3

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers worth asking again: throttled, or the server (or a proxy) failed."""


class KubeError(RuntimeError):
    """A failed API call: `status` is the HTTP status (0: no answer), `message` the API
    server's message (else the client's), `reason` the Status reason (`NotFound`, ...)."""

    def __init__(self, what: str, status: int, message: str, reason: str = "") -> None:
        answer = f"HTTP {status}" if status else "no answer"
        super().__init__(f"{what}: {answer}: {message}")
        self.what = what
        self.status = status
        self.message = message
        self.reason = reason


class NotFoundError(KubeError):
    """404: the object (or its namespace) does not exist."""


class ConflictError(KubeError):
    """409: the object changed since it was read (optimistic concurrency)."""


class AlreadyExistsError(KubeError):
    """409 AlreadyExists: a create found an object of that name."""


class GoneError(KubeError):
    """410: the resourceVersion of a watch or list is too old; list again."""


def kube_error(what: str, status: int, message: str, reason: str = "") -> KubeError:
    """The KubeError (subclass) for an answer with `status` and the Status `reason`."""
    cls: type[KubeError] = KubeError
    if status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = AlreadyExistsError if reason == "AlreadyExists" else ConflictError
    elif status == 410:
        cls = GoneError
    return cls(what, status, message, reason)


def status_fields(body: object) -> tuple[str, str]:
    """(message, reason) of the Status object in an error answer's body; "" where absent."""
    if not isinstance(body, str | bytes) or not body:
        return "", ""
    try:
        status = json.loads(body)
    except ValueError:
        return "", ""
    if not isinstance(status, dict):
        return "", ""
    return str(status.get("message") or ""), str(status.get("reason") or "")


def api_error(what: str, exc: BaseException) -> KubeError | None:
    """`exc` as a KubeError when it is an API or transport failure (None otherwise: a bug
    is not an API error). `what` names the call in the message."""
    if isinstance(exc, KubeError):
        return exc
    # Only a process that imported the official client can have its ApiException (this
    # package never imports it).
    official = sys.modules.get("kubernetes.client.exceptions")
    if official is not None and isinstance(exc, official.ApiException):
        message, reason = status_fields(exc.body)
        return kube_error(what, int(exc.status or 0), message or str(exc.reason), reason)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return KubeError(what, 0, str(exc) or type(exc).__name__)
    return None


def transient(exc: BaseException) -> bool:
    """Whether a failed call is worth trying again: 429, 5xx or no answer."""
    if not isinstance(exc, KubeError):
        mapped = api_error("", exc)
        if mapped is None:
            return False
        exc = mapped
    return exc.status == 0 or exc.status in TRANSIENT_STATUSES
