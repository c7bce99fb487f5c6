"""The shared API error mapping and the transient predicate (pure), and the lazy import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from lj_runtimekit.proto.pkg.kube import (
    AlreadyExistsError,
    ConflictError,
    GoneError,
    KubeError,
    NotFoundError,
    api_error,
    kube_error,
    transient,
)


def _api_exception(status: int, reason: str, body: object = None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps(body).encode() if body is not None else None
    return exc


def test_importing_the_package_does_not_import_the_official_client() -> None:
    """The Device Plugin and the Exporter import it on nodes without API access."""
    code = (
        "import sys, lj_runtimekit.proto.pkg.kube;"
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [
        (404, "NotFound", NotFoundError),
        (409, "AlreadyExists", AlreadyExistsError),
        (409, "Conflict", ConflictError),
        (409, "", ConflictError),
        (410, "Expired", GoneError),
        (500, "InternalError", KubeError),
        (0, "", KubeError),
    ],
)
def test_each_status_its_class(status: int, reason: str, cls: type[KubeError]) -> None:
    error = kube_error("GET /api/v1/nodes/a", status, "the message", reason)
    assert type(error) is cls
    assert (error.status, error.message, error.reason) == (status, "the message", reason)


def test_the_message_names_the_call_the_status_and_the_server_message() -> None:
    assert str(kube_error("GET /x", 404, 'x "a" not found')) == 'GET /x: HTTP 404: x "a" not found'
    assert str(KubeError("read node a", 0, "connection refused")) == (
        "read node a: no answer: connection refused"
    )


def test_an_api_exception_maps_with_the_status_objects_message_and_reason() -> None:
    exc = _api_exception(
        409,
        "Conflict",
        {"kind": "Status", "message": 'jobs.batch "j" already exists', "reason": "AlreadyExists"},
    )
    error = api_error("create job ns/j", exc)
    assert isinstance(error, AlreadyExistsError)
    assert str(error) == 'create job ns/j: HTTP 409: jobs.batch "j" already exists'
    # No Status body (a proxy's answer): the HTTP reason phrase stands in.
    bare = api_error("GET /x", _api_exception(503, "Service Unavailable"))
    assert bare is not None
    assert (bare.status, bare.message, bare.reason) == (503, "Service Unavailable", "")
    garbled = _api_exception(502, "Bad Gateway")
    garbled.body = b"<html>bad gateway</html>"
    assert str(api_error("GET /x", garbled)) == "GET /x: HTTP 502: Bad Gateway"


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("timed out"),
        urllib3.exceptions.ProtocolError("Connection broken"),
        urllib3.exceptions.MaxRetryError(None, "/api", "too many retries"),  # type: ignore[arg-type]
    ],
)
def test_no_answer_is_status_0(exc: Exception) -> None:
    error = api_error("GET /api", exc)
    assert error is not None
    assert error.status == 0
    assert str(error).startswith("GET /api: no answer: ")


def test_a_bug_is_not_an_api_error() -> None:
    assert api_error("GET /x", ValueError("not JSON")) is None
    assert api_error("GET /x", KeyError("metadata")) is None
    same = KubeError("GET /x", 500, "m")
    assert api_error("something else", same) is same


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 0])
def test_transient_statuses(status: int) -> None:
    assert transient(kube_error("GET /x", status, "m"))
    if status:
        assert transient(_api_exception(status, "r"))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422, 501])
def test_final_statuses(status: int) -> None:
    assert not transient(kube_error("GET /x", status, "m"))
    assert not transient(_api_exception(status, "r"))


def test_transport_failures_are_transient_and_bugs_are_not() -> None:
    assert transient(ConnectionResetError())
    assert transient(urllib3.exceptions.ReadTimeoutError(None, "/x", "read timed out"))  # type: ignore[arg-type]
    assert not transient(ValueError("x"))
    assert not transient(RuntimeError("x"))
