"""The one client of the Runtime gRPC contract used by every component."""

from lj_runtimekit.proto.pkg.runtimeclient.client import (
    DEFAULT_SOCKET_DIR,
    DEFAULT_SOCKET_NAME,
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)

__all__ = [
    "DEFAULT_SOCKET_DIR",
    "DEFAULT_SOCKET_NAME",
    "RetryPolicy",
    "RuntimeCallError",
    "RuntimeClient",
    "RuntimeUnavailableError",
]
