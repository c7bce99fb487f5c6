"""The informer's `error`: why its list or watch fails, cleared once one gets through (real
API server; a server that does not answer)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.proto.pkg.kube import Informer, KubeClient, KubeObject
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.waits import wait_for


class _FailingLists(KubeClient):
    """While `failing`, lists ask the server for a field it cannot select on (a 400)."""

    failing = True

    def list_all(
        self, path: str, params: Mapping[str, str] | None = None, page: int = 500
    ) -> tuple[list[KubeObject], str]:
        if self.failing:
            params = {**(params or {}), "fieldSelector": "spec.noSuchField=x"}
        return super().list_all(path, params, page)


def test_the_error_names_why_the_server_cannot_be_listed() -> None:
    configuration = k8s_client.Configuration(host=f"http://127.0.0.1:{free_port()}")
    kube = KubeClient(k8s_client.ApiClient(configuration))
    informer = Informer(kube, "/api/v1/pods", lambda t, o: None, "pods", initial_backoff_s=0.05)
    informer.start()
    try:
        wait_for(
            lambda: informer.error, 10, "the informer's error", describe=lambda: informer.error
        )
        assert "GET /api/v1/pods" in str(informer.error)
        assert "no answer" in str(informer.error)
        assert not informer.synced.is_set()
    finally:
        informer.stop()
        kube.close()


@pytest.mark.controlplane
def test_the_error_clears_once_a_list_gets_through(
    control_plane: ControlPlane, namespace: str
) -> None:
    kube = _FailingLists(control_plane.api_client())
    informer = Informer(
        kube,
        f"/api/v1/namespaces/{namespace}/pods",
        lambda t, o: None,
        "pods",
        initial_backoff_s=0.05,
        max_backoff_s=0.2,
    )
    informer.start()
    try:
        wait_for(
            lambda: "spec.noSuchField" in (informer.error or ""),
            30,
            "the refused list as the informer's error",
            describe=lambda: informer.error,
        )
        assert not informer.synced.is_set()
        kube.failing = False
        assert informer.synced.wait(30)
        assert informer.error is None
    finally:
        informer.stop()
        kube.close()


@pytest.mark.controlplane
def test_stop_cuts_the_open_watch(control_plane: ControlPlane, namespace: str) -> None:
    kube = KubeClient(control_plane.api_client())
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    seen: list[str] = []
    informer = Informer(kube, path, lambda t, o: seen.append(o["metadata"]["name"]), "cms")
    informer.start()
    try:
        assert informer.synced.wait(30)
        kube.request("POST", path, body={"metadata": {"name": "watched"}})
        wait_for(lambda: "watched" in seen, 30, "the watch's ADDED", describe=seen.copy)
        # The server would hold this watch open for minutes: stop cuts it.
        informer.stop()
        wait_for(lambda: not informer.running, 5, "the informer's thread to end")
        kube.request("POST", path, body={"metadata": {"name": "after"}})
        assert informer.error is None
        # The client's pool still serves requests (the cut connection is not reused).
        assert kube.request("GET", f"{path}/after")["metadata"]["name"] == "after"
    finally:
        informer.stop()
        kube.close()
