"""API server fallback: the node's pods by `spec.nodeName` field selector.

Used only when the kubelet read-only port does not answer. It costs a LIST
against the API server per collection, so the kubelet stays the first choice.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from lj_runtimekit.exporter.internal.pods.kubelet import PodSourceError
from lj_runtimekit.exporter.internal.pods.model import Pod, PodListError, parse_pod_list


class ApiServerPods:
    """Lists the pods bound to one node through the API server."""

    def __init__(self, node_name: str, kubeconfig: str | None, timeout_s: float = 10.0) -> None:
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self.timeout_s = timeout_s
        self._api: Any = None
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        """Description for log lines and errors."""
        origin = f"kubeconfig {self.kubeconfig}" if self.kubeconfig else "in-cluster config"
        return f"API server ({origin}) pods of node {self.node_name}"

    def _core_api(self) -> Any:
        with self._lock:
            if self._api is None:
                from kubernetes import client, config

                try:
                    if self.kubeconfig:
                        api_client = config.new_client_from_config(config_file=self.kubeconfig)
                    else:
                        config.load_incluster_config()
                        api_client = client.ApiClient()
                except (config.ConfigException, OSError, TypeError, ValueError) as exc:
                    raise PodSourceError(f"{self.where}: cannot load config: {exc}") from exc
                self._api = client.CoreV1Api(api_client)
            return self._api

    def _fetch(self) -> tuple[Pod, ...]:
        from kubernetes.client.exceptions import ApiException

        api = self._core_api()
        try:
            response = api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}",
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )
            data = json.loads(response.data)
        except ApiException as exc:
            raise PodSourceError(f"{self.where}: HTTP {exc.status} {exc.reason}") from exc
        except (OSError, ValueError) as exc:
            raise PodSourceError(f"{self.where}: {exc}") from exc
        except Exception as exc:  # urllib3 errors do not share a narrower base
            raise PodSourceError(f"{self.where}: {type(exc).__name__}: {exc}") from exc
        try:
            return parse_pod_list(data, self.where)
        except PodListError as exc:
            raise PodSourceError(str(exc)) from exc

    async def list_pods(self) -> tuple[Pod, ...]:
        """The node's pods; raise PodSourceError when the API server cannot be read."""
        return await asyncio.to_thread(self._fetch)
