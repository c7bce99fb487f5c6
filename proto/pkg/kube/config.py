"""Where the API server is and how to reach it: a kubeconfig file, else in-cluster.

`load_access` reads both without the official client (importing it costs seconds of CPU
and about 75 MB: every API and model class); `load_configuration` and `load_api_client`
build the official client's objects for code that uses its typed API.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD_S = 60.0


class KubeConfigError(Exception):
    """API access is configured but not usable; the message names what and why."""


class NoApiAccessError(KubeConfigError):
    """No API access is configured: no kubeconfig given and not running in a cluster."""


def in_cluster() -> bool:
    """Whether this process runs in a pod (the kubelet sets KUBERNETES_SERVICE_HOST)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def load_configuration(kubeconfig: str | None) -> Any:
    """The client Configuration from `kubeconfig`, else in-cluster; NoApiAccessError when
    neither is there, KubeConfigError when the one there is not usable."""
    if not kubeconfig and not in_cluster():
        raise NoApiAccessError(
            "no --kubeconfig given and not running in a cluster (KUBERNETES_SERVICE_HOST is"
            " not set)"
        )
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    if kubeconfig:
        if not os.path.exists(kubeconfig):
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
        try:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        except Exception as exc:  # the loader raises ConfigException, OSError, YAML errors...
            raise KubeConfigError(f"kubeconfig {kubeconfig} is not usable: {exc}") from exc
        return configuration
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException as exc:
        raise KubeConfigError(f"in-cluster configuration is not usable: {exc}") from exc
    return configuration


def load_api_client(kubeconfig: str | None, pool_size: int | None = None) -> Any:
    """An ApiClient (see `load_configuration`); `pool_size` bounds its connection pool
    (the client's default when None)."""
    configuration = load_configuration(kubeconfig)
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    from kubernetes import client as k8s_client

    return k8s_client.ApiClient(configuration)


@dataclass
class ApiAccess:
    """Where the API server is and the credentials to present, without the official client:
    what `KubeClient` and kopf connect with. Paths and PEM data are alternatives."""

    server: str
    ca_path: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    cert_path: str | None = None
    cert_data: bytes | None = None
    key_path: str | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_path: str | None = None
    """Read again when older than TOKEN_REREAD_S: the kubelet rotates projected tokens."""
    username: str | None = None
    password: str | None = None
    header: Callable[[], str | None] | None = None
    """The Authorization header, from a loader this module hands over to (exec plugins)."""
    _read: tuple[float, str] = field(default=(0.0, ""), init=False, repr=False, compare=False)

    def authorization(self) -> str | None:
        """The Authorization header value now (None: none, e.g. client certificates)."""
        if self.header is not None:
            return self.header()
        if self.token_path:
            read_at, token = self._read
            if not token or time.monotonic() - read_at > TOKEN_REREAD_S:
                token = Path(self.token_path).read_text().strip()
                self._read = (time.monotonic(), token)
            return f"Bearer {token}"
        if self.token:
            return f"Bearer {self.token}"
        if self.username is not None:
            pair = f"{self.username}:{self.password or ''}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        return None

    @classmethod
    def from_configuration(cls, configuration: Any) -> ApiAccess:
        """The access an official client Configuration describes (its token refreshed)."""

        def header() -> str | None:
            hook = configuration.refresh_api_key_hook
            if hook is not None:
                hook(configuration)
            value: str | None = configuration.get_api_key_with_prefix(
                "authorization"
            ) or configuration.get_api_key_with_prefix("BearerToken")
            return value

        return cls(
            server=configuration.host,
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            tls_server_name=getattr(configuration, "tls_server_name", None),
            cert_path=configuration.cert_file,
            key_path=configuration.key_file,
            header=header,
        )


def load_access(kubeconfig: str | None) -> ApiAccess:
    """The access from `kubeconfig` (its current context), else in-cluster, read without
    importing the official client (a kubeconfig user with an exec plugin or auth provider
    is handed to the official loader); errors as `load_configuration`."""
    if not kubeconfig and not in_cluster():
        raise NoApiAccessError(
            "no --kubeconfig given and not running in a cluster (KUBERNETES_SERVICE_HOST is"
            " not set)"
        )
    if not kubeconfig:
        return _in_cluster_access()
    if not os.path.exists(kubeconfig):
        raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
    try:
        return _kubeconfig_access(kubeconfig)
    except _Delegate:
        return ApiAccess.from_configuration(load_configuration(kubeconfig))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"kubeconfig {kubeconfig} is not usable: {exc}") from exc


class _Delegate(Exception):
    """The kubeconfig's user authenticates in a way only the official loader implements."""


def _in_cluster_access() -> ApiAccess:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    token = os.path.join(SERVICE_ACCOUNT_DIR, "token")
    ca = os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")
    for path in (token, ca):
        if not os.path.isfile(path):
            raise KubeConfigError(f"in-cluster configuration is not usable: {path} is missing")
    if not port:
        raise KubeConfigError(
            "in-cluster configuration is not usable: KUBERNETES_SERVICE_PORT is not set"
        )
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return ApiAccess(server=f"https://{host}:{port}", ca_path=ca, token_path=token)


def _named(config: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    for entry in config.get(kind + "s") or ():
        if entry.get("name") == name:
            found: dict[str, Any] = entry.get(kind) or {}
            return found
    raise ValueError(f"{kind} {name!r} is not in {kind}s")


def _kubeconfig_access(kubeconfig: str) -> ApiAccess:
    with open(kubeconfig, encoding="utf-8") as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        raise ValueError("not a kubeconfig (no mapping at the top)")
    current = config.get("current-context")
    if not current:
        raise ValueError("no current-context")
    context = _named(config, "context", current)
    cluster = _named(config, "cluster", context.get("cluster", ""))
    user = _named(config, "user", context["user"]) if context.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise _Delegate
    if not cluster.get("server"):
        raise ValueError(f"cluster {context.get('cluster')!r} has no server")
    base = os.path.dirname(os.path.abspath(kubeconfig))

    def path(key: str, where: dict[str, Any]) -> str | None:
        value = where.get(key)
        return os.path.join(base, value) if value else None

    def data(key: str, where: dict[str, Any]) -> bytes | None:
        value = where.get(key)
        return base64.b64decode(value) if value else None

    return ApiAccess(
        server=str(cluster["server"]).rstrip("/"),
        ca_path=path("certificate-authority", cluster),
        ca_data=data("certificate-authority-data", cluster),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name"),
        cert_path=path("client-certificate", user),
        cert_data=data("client-certificate-data", user),
        key_path=path("client-key", user),
        key_data=data("client-key-data", user),
        token=user.get("token"),
        token_path=path("tokenFile", user),
        username=user.get("username"),
        password=user.get("password"),
    )
