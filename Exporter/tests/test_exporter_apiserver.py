"""The API server pod watch against a real control plane: with the kubelet port closed (or
not used) the exporter watches the node's pods by spec.nodeName and keeps the per-pod
series, without a request to the API server per collection; the watch ends when the kubelet
answers again."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit.exporter.internal.pods.apiserver import ApiServerPods
from lj_runtimekit.exporter.internal.pods.kubelet import KubeletPods
from lj_runtimekit.exporter.internal.pods.source import NodePods
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess


def _pod(name: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "registry.example/train:1"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def pod_requests(api_client: k8s.ApiClient) -> dict[str, float]:
    """Cluster-wide pod requests the API server has finished, by verb (its
    apiserver_request_total)."""
    response = api_client.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
    )[0]
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.data.decode()):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "apiserver_request_total"
                and labels.get("resource") == "pods"
                and labels.get("scope") == "cluster"
                and not labels.get("subresource")
            ):
                verb = labels["verb"]
                counts[verb] = counts.get(verb, 0.0) + sample.value
    return counts


@pytest.mark.controlplane
def test_pods_from_the_api_server_while_the_kubelet_port_is_closed(
    lj: Any, control_plane: Any, api_client: k8s.ApiClient, namespace: str, node_factory: Any
) -> None:
    node = node_factory.create(f"{node_factory.group}-a", gpus=8)
    core = k8s.CoreV1Api(api_client)
    base = lj.short_dir()
    key = lj.PROTOCOL.annotations.allocated_devices
    with SimulatorProcess(base / "s", EXAMPLE_NODES / "tdm-8gpu.yaml") as sim:
        devices = lj.allocate(sim.socket_dir, [])
        share = DeviceShare(devices[2].id, 25, 50)
        created = core.create_namespaced_pod(
            namespace, _pod("trainer", node, {key: encode_assignment({"c": (share,)})})
        )
        # Bound to another node: the field selector must leave it out.
        core.create_namespaced_pod(namespace, _pod("elsewhere", "some-other-node", {}))
        pod = lj.PodSpec(created.metadata.uid, namespace, "trainer", ("c",), {})
        lj.allocate(sim.socket_dir, [lj.Grant(pod, "c", share)])

        exporter = lj.ExporterProcess(
            [
                "--runtime-socket-dir",
                str(sim.socket_dir),
                "--kubelet-pods-url",
                f"http://127.0.0.1:{lj.free_port()}/pods",  # nothing listens there
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
                "--apiserver-fallback",
                "auto",
                "--node-name",
                node,
                "--collection-interval",
                "0.5",
            ],
            base,
        )
        try:
            scrape = exporter.wait_scrape(
                "the trainer pod's series from the API server view",
                lambda s: bool(
                    s.select("lj_runtimekit_container_utilization_ratio", pod="trainer")
                ),
                timeout=30,
            )
            assert scrape.value("lj_runtimekit_exporter_pods", source="apiserver") == 1
            assert scrape.value("lj_runtimekit_kubelet_up") == 0
            assert (
                scrape.value("lj_runtimekit_exporter_collection_errors_total", source="kubelet")
                >= 1
            )
            labels = {"namespace": namespace, "pod": "trainer", "container": "c", "device": "2"}
            assert scrape.value("lj_runtimekit_container_core_allocated_ratio", **labels) == 0.25
            assert scrape.value("lj_runtimekit_device_memory_allocated_ratio", device="2") == 0.5
            # Steady state: collections read the watch's copy, the API server sees no list.
            before = pod_requests(api_client)
            done = scrape.value("lj_runtimekit_exporter_collection_duration_seconds_count")
            exporter.wait_scrape(
                "ten more collections",
                lambda s: (
                    s.value("lj_runtimekit_exporter_collection_duration_seconds_count") >= done + 10
                ),
            )
            after = pod_requests(api_client)
            assert after.get("LIST", 0) - before.get("LIST", 0) == 0, (before, after)
            log = exporter.log()
            assert log.count("reading pods from the API server") == 1
        finally:
            assert exporter.stop() == 0


@pytest.mark.controlplane
def test_without_the_kubelet_port_pods_come_from_one_watch(
    lj: Any, control_plane: Any, api_client: k8s.ApiClient, namespace: str, node_factory: Any
) -> None:
    node = node_factory.create(f"{node_factory.group}-w", gpus=8)
    core = k8s.CoreV1Api(api_client)
    base = lj.short_dir()
    key = lj.PROTOCOL.annotations.allocated_devices
    with SimulatorProcess(base / "s", EXAMPLE_NODES / "tdm-8gpu.yaml") as sim:
        devices = lj.allocate(sim.socket_dir, [])
        before = pod_requests(api_client)
        exporter = lj.ExporterProcess(
            [
                "--runtime-socket-dir",
                str(sim.socket_dir),
                "--kubelet-pods-url",
                "",
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
                "--apiserver-fallback",
                "auto",
                "--node-name",
                node,
                "--collection-interval",
                "0.3",
            ],
            base,
        )
        try:
            exporter.wait_scrape(
                "an empty pods view from the API server",
                lambda s: s.value("lj_runtimekit_exporter_pods", source="apiserver") == 0,
            )
            # A pod created after the first list arrives by the watch.
            share = DeviceShare(devices[1].id, 30, 40)
            created = core.create_namespaced_pod(
                namespace, _pod("late", node, {key: encode_assignment({"c": (share,)})})
            )
            lj.allocate(
                sim.socket_dir,
                [
                    lj.Grant(
                        lj.PodSpec(created.metadata.uid, namespace, "late", ("c",), {}), "c", share
                    )
                ],
            )
            scrape = exporter.wait_scrape(
                "the late pod's series",
                lambda s: bool(s.select("lj_runtimekit_container_utilization_ratio", pod="late")),
            )
            assert scrape.value("lj_runtimekit_container_core_allocated_ratio", pod="late") == 0.3
            assert "lj_runtimekit_kubelet_up" not in scrape.names()
            assert not scrape.select(
                "lj_runtimekit_exporter_collection_errors_total", source="kubelet"
            ) or (
                scrape.value("lj_runtimekit_exporter_collection_errors_total", source="kubelet")
                == 0
            )
            core.delete_namespaced_pod("late", namespace, grace_period_seconds=0)
            scrape = exporter.wait_scrape(
                "the deleted pod's series gone",
                lambda s: not s.select("lj_runtimekit_container_core_allocated_ratio", pod="late"),
            )
            done = scrape.value("lj_runtimekit_exporter_collection_duration_seconds_count")
            exporter.wait_scrape(
                "ten more collections",
                lambda s: (
                    s.value("lj_runtimekit_exporter_collection_duration_seconds_count") >= done + 10
                ),
            )
            after = pod_requests(api_client)
            # One list and a watch in flight, whatever the number of collections.
            assert after.get("LIST", 0) - before.get("LIST", 0) == 1, (before, after)
            assert after.get("WATCH", 0) - before.get("WATCH", 0) <= 1, (before, after)
        finally:
            assert exporter.stop() == 0


@pytest.mark.controlplane
async def test_the_fallback_watch_stops_when_the_kubelet_answers_and_lists_anew_after(
    lj: Any, control_plane: Any, api_client: k8s.ApiClient, namespace: str, node_factory: Any
) -> None:
    node = node_factory.create(f"{node_factory.group}-f", gpus=8)
    core = k8s.CoreV1Api(api_client)
    kubelet = lj.kubelet_pods([lj.PodSpec("k1", namespace, "from-kubelet", ("c",), {})])
    kubelet.port = urlsplit(kubelet.url).port  # started again on the same port
    fallback = ApiServerPods(node, str(control_plane.kubeconfig_path))

    def pods_are(*names: str) -> None:
        lj.wait_for(
            lambda: (
                sorted(p.metadata.name for p in core.list_namespaced_pod(namespace).items)
                == sorted(names)
            ),
            30,
            f"the namespace's pods to be {names}",
        )

    async with contextlib.aclosing(KubeletPods(kubelet.url, timeout_s=2)) as pods:
        source = NodePods(pods, fallback)

        async def kubelet_down_then_up(*expected: str) -> None:
            """The kubelet stops answering (the watch starts and lists `expected`), then
            answers again: the watch ends at once, not when the server would end it
            (minutes later)."""
            kubelet.stop()
            read = await source.read()
            assert read.view is not None
            assert read.view.source == "apiserver"
            assert {p.name for p in read.view.pods} == set(expected)
            assert fallback.watching
            kubelet.start()
            read = await source.read()
            assert read.view is not None
            assert read.view.source == "kubelet"
            lj.wait_for(lambda: not fallback.watching, 10, "the API server watch to end")

        try:
            read = await source.read()
            assert read.view is not None
            assert read.view.source == "kubelet"
            assert not fallback.watching
            # No pod on the node: nothing on the watch's stream wakes its reader up.
            await kubelet_down_then_up()
            # A pod created while no watch runs: the next fallback lists it.
            core.create_namespaced_pod(namespace, _pod("before", node, {}))
            pods_are("before")
            await kubelet_down_then_up("before")
            # Deleted while no watch runs: not served from the earlier copy.
            core.delete_namespaced_pod("before", namespace, grace_period_seconds=0)
            core.create_namespaced_pod(namespace, _pod("later", node, {}))
            pods_are("later")
            await kubelet_down_then_up("later")
        finally:
            kubelet.stop()
            fallback.stop()
