"""Where the API server is and how to reach it: a kubeconfig file, else in-cluster.

The official client is imported only once access is configured: it takes seconds
of CPU to import, and nodes without API access never need it.
"""

from __future__ import annotations

import os
from typing import Any


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
