"""The one client of the Runtime gRPC contract used by every component."""

from lj_runtimekit.proto.pkg.runtimeclient.client import (
    DEFAULT_SOCKET_DIR,
    DEFAULT_SOCKET_NAME,
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.runtimeclient.shares import (
    WHOLE_PERCENT,
    from_request,
    normalize,
    to_request,
)

__all__ = [
    "DEFAULT_SOCKET_DIR",
    "DEFAULT_SOCKET_NAME",
    "WHOLE_PERCENT",
    "RetryPolicy",
    "RuntimeCallError",
    "RuntimeClient",
    "RuntimeUnavailableError",
    "from_request",
    "normalize",
    "to_request",
]
