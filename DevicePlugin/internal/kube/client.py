"""Kubernetes API access: configuration, the node's pod list, pod and node patches.

Blocking calls of the official client; callers run them in a thread. The
client is imported only when API access is configured (it takes seconds of
CPU to import, and nodes without API access never need it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)


class KubeConfigError(Exception):
    """No usable API server configuration."""


class KubeApi:
    """The calls the Device Plugin makes to the API server."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client as k8s_client

        self._core = k8s_client.CoreV1Api(api_client)

    @classmethod
    def load(cls, kubeconfig: str | None) -> KubeApi | None:
        """From `kubeconfig`, else in-cluster; None when neither exists."""
        if not kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config

        if kubeconfig:
            if not os.path.exists(kubeconfig):
                raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
            try:
                api_client = k8s_config.new_client_from_config(config_file=kubeconfig)
            except Exception as exc:
                raise KubeConfigError(f"kubeconfig {kubeconfig} is not usable: {exc}") from exc
            return cls(api_client)
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException as exc:
            raise KubeConfigError(f"in-cluster configuration is not usable: {exc}") from exc
        return cls(k8s_client.ApiClient(configuration))

    def list_node_pods(self, node_name: str) -> bytes:
        """The raw PodList of the pods bound to `node_name`."""
        response = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name}", _preload_content=False
        )
        data: bytes = response.data
        return data

    def watch_node_pods(
        self, node_name: str, resource_version: str, stop: threading.Event
    ) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(event type, raw pod object) of the pods bound to `node_name`, from
        `resource_version` on, until the server ends the watch or `stop` is set."""
        from kubernetes import watch

        w = watch.Watch()
        stream = w.stream(
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node_name}",
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _request_timeout=330,
        )
        for event in stream:
            if stop.is_set():
                w.stop()
                return
            etype = str(event.get("type", ""))
            if etype == "BOOKMARK":
                continue
            raw = event.get("raw_object")
            if isinstance(raw, dict):
                yield etype, raw

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch annotations onto a pod."""
        self._core.patch_namespaced_pod(
            name, namespace, {"metadata": {"annotations": dict(annotations)}}
        )

    def label_node(
        self,
        node_name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None] | None = None,
    ) -> None:
        """Merge-patch labels (and annotations) onto a node (None removes a key)."""
        meta: dict[str, Any] = {"labels": dict(labels)}
        if annotations:
            meta["annotations"] = dict(annotations)
        self._core.patch_node(node_name, {"metadata": meta})

    def node_labels(self, node_name: str) -> dict[str, str]:
        """The node's current labels."""
        response = self._core.read_node(node_name, _preload_content=False)
        labels = json.loads(response.data).get("metadata", {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}
