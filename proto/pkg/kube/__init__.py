"""Kubernetes API access shared by the components: configuration, errors, retries, a JSON
client and the informer. None of it imports the official client (only
`load_configuration` and `load_api_client`, which build its objects, do)."""

from lj_runtimekit.proto.pkg.kube.client import (
    MERGE_PATCH,
    METADATA_LIST,
    STRATEGIC_MERGE_PATCH,
    KubeClient,
    KubeObject,
    RateLimiter,
    WatchCanceller,
)
from lj_runtimekit.proto.pkg.kube.config import (
    ApiAccess,
    KubeConfigError,
    NoApiAccessError,
    in_cluster,
    load_access,
    load_api_client,
    load_configuration,
)
from lj_runtimekit.proto.pkg.kube.errors import (
    AlreadyExistsError,
    ConflictError,
    GoneError,
    KubeError,
    NotFoundError,
    api_error,
    kube_error,
    transient,
)
from lj_runtimekit.proto.pkg.kube.informer import Handler, Informer
from lj_runtimekit.proto.pkg.kube.retry import RetryPolicy, call, call_async, log_retry
from lj_runtimekit.proto.pkg.kube.timestamps import api_time, micro_time

__all__ = [
    "MERGE_PATCH",
    "METADATA_LIST",
    "STRATEGIC_MERGE_PATCH",
    "AlreadyExistsError",
    "ApiAccess",
    "ConflictError",
    "GoneError",
    "Handler",
    "Informer",
    "KubeClient",
    "KubeConfigError",
    "KubeError",
    "KubeObject",
    "NoApiAccessError",
    "NotFoundError",
    "RateLimiter",
    "RetryPolicy",
    "WatchCanceller",
    "api_error",
    "api_time",
    "call",
    "call_async",
    "in_cluster",
    "kube_error",
    "load_access",
    "load_api_client",
    "load_configuration",
    "log_retry",
    "micro_time",
    "transient",
]
