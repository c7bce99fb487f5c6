"""Against the real API server: node labels, pod records, and the pod list fallback by nodeName."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.proto.pkg import protocolinfo
from lj_runtimekit.proto.pkg.protocol import DeviceShare, decode_assignment, encode_assignment
from lj_runtimekit.testkit.kubelet.bed import ANN, GPU, PROTOCOL, node_bed


def _pod(core: k8s_client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    response = core.read_namespaced_pod(name, namespace, _preload_content=False)
    data: dict[str, Any] = json.loads(response.data)
    return data


@pytest.mark.controlplane
async def test_labels_records_and_api_fallback(
    control_plane: Any,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: Any,
    workdir: Path,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    node = node_factory.create(f"{namespace}-gpu")
    args = [
        "--label-node=true",
        f"--kubeconfig={control_plane.kubeconfig_path}",
        f"--node-name={node}",
        "--kubelet-pods-url=http://127.0.0.1:1/pods",  # closed: the API server is the fallback
    ]
    async with node_bed(workdir, "tdm-8gpu", plugin_args=args) as bed:
        labels = PROTOCOL.labels
        want = {
            labels.device_kind: "gpu",
            labels.device_model: "A100-SXM4-80GB",
            labels.device_count: "8",
            labels.device_mode: "tdm",
            labels.runtime_version: "v1.14.0",
        }
        deadline = time.monotonic() + 30
        while True:  # the node factory labels its own fake model first; ours replace them
            got = core.read_node(node).metadata.labels or {}
            if all(got.get(k) == v for k, v in want.items()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert {k: got.get(k) for k in want} == want
        inventory = core.read_node(node).metadata.annotations[ANN.node_devices]
        assert all(d.id in inventory for d in bed.devices)
        # Written before the sockets serve: the protocol it loaded (deploy-all.sh verify).
        reported = core.read_node(node).metadata.annotations[protocolinfo.NODE_ANNOTATION]
        assert reported == protocolinfo.protocol_sha256(PROTOCOL)

        assignment = {"main": (DeviceShare(bed.gpu(4)),)}
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "trainer",
                "annotations": {
                    ANN.assigned_devices: encode_assignment(assignment),
                    ANN.assume_time: "1",
                },
            },
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
                    }
                ],
            },
        }
        core.create_namespaced_pod(namespace, manifest)
        pod = _pod(core, namespace, "trainer")
        opts = (await bed.kubelet.admit(pod))["main"]
        assert opts.envs["LJ_VISIBLE_DEVICES"] == bed.gpu(4)

        deadline = time.monotonic() + 30
        while ANN.allocated_devices not in pod["metadata"].get("annotations", {}):
            assert time.monotonic() < deadline, bed.fail("no allocation record on the pod")
            await asyncio.sleep(0.2)
            pod = _pod(core, namespace, "trainer")
        deadline = time.monotonic() + 30
        while pod["metadata"]["annotations"].get(ANN.bind_phase) != "allocated":
            assert time.monotonic() < deadline, bed.fail("bind phase not set to allocated")
            await asyncio.sleep(0.2)
            pod = _pod(core, namespace, "trainer")
        record = decode_assignment(pod["metadata"]["annotations"][ANN.allocated_devices])
        assert record == assignment

        # A crash between the Runtime's Allocate and the record's write: the restarted plugin
        # finds the Runtime's allocation without a record on the pod and writes it.
        bed.plugin.stop()
        core.patch_namespaced_pod(
            "trainer",
            namespace,
            {"metadata": {"annotations": {ANN.allocated_devices: None, ANN.bind_phase: None}}},
        )
        bed.plugin.start()
        deadline = time.monotonic() + 30
        pod = _pod(core, namespace, "trainer")
        while pod["metadata"].get("annotations", {}).get(ANN.bind_phase) != "allocated":
            assert time.monotonic() < deadline, bed.fail("record not rewritten after restart")
            await asyncio.sleep(0.2)
            pod = _pod(core, namespace, "trainer")
        record = decode_assignment(pod["metadata"]["annotations"][ANN.allocated_devices])
        assert record == assignment
        log = bed.plugin.log()
        assert log.count("reading the node's pods from the API server instead") == 1


@pytest.mark.controlplane
async def test_labels_are_retried_until_written(
    control_plane: Any,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: Any,
    workdir: Path,
) -> None:
    """The label write fails (the Node does not exist yet): it is retried with backoff and
    lands once the Node is there, with no device event in between."""
    core = k8s_client.CoreV1Api(api_client)
    name = f"{namespace}-late"
    args = [
        "--label-node=true",
        f"--kubeconfig={control_plane.kubeconfig_path}",
        f"--node-name={name}",
    ]
    async with node_bed(workdir, "tdm-8gpu", plugin_args=args) as bed:
        deadline = time.monotonic() + 30
        while "node labels not written" not in bed.plugin.log():
            assert time.monotonic() < deadline, bed.fail("the label write never failed")
            await asyncio.sleep(0.2)
        node_factory.create(name)
        count = PROTOCOL.labels.device_count
        deadline = time.monotonic() + 60
        while (core.read_node(name).metadata.labels or {}).get(count) != "8":
            assert time.monotonic() < deadline, bed.fail("labels never written")
            await asyncio.sleep(0.2)
        annotations = core.read_node(name).metadata.annotations or {}
        assert ANN.node_devices in annotations
