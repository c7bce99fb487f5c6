"""API server fallback against a real control plane: with the kubelet port closed the
exporter lists the node's pods by spec.nodeName and keeps the per-pod series."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

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
            exporter.wait_scrape(
                "another collection",
                lambda s: s.value("lj_runtimekit_exporter_collection_duration_seconds_count") >= 3,
            )
            log = exporter.log()
            assert log.count("reading pods from the API server") == 1
        finally:
            assert exporter.stop() == 0
