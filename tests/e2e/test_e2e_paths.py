"""End to end on the sandbox bed: label -> enable -> capacity -> schedule -> Allocate -> metrics
for whole devices, TDM slices and MIG; the sharing invariant across the scheduler, the
Device Plugin and the Runtime; admission failures; a device going unhealthy."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.proto.pkg.protocol.inventory import decode_inventory
from lj_runtimekit.sandbox import Sandbox, workload
from lj_runtimekit.sandbox.workload import pod_manifest
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

BED_KINDS = ("tdm-8gpu", "mig-8gpu")


def _node(api: k8s_client.ApiClient, name: str) -> dict[str, object]:
    response = k8s_client.CoreV1Api(api).read_node(name, _preload_content=False)
    node: dict[str, object] = json.loads(response.data)
    return node


def _consistent(bed: Sandbox, api: k8s_client.ApiClient, ns: str, names: list[str]) -> None:
    """Until every named pod is Running and the three layers agree with the invariant."""

    def check() -> bool | NotYet:
        rows, runtime = workload.observe(bed, api, [ns])
        mine = [r for r in rows if r.name in names]
        not_running = [(r.name, r.phase, r.reason) for r in mine if r.phase != "Running"]
        violations = workload.invariant_violations(rows, runtime, bed.protocol)
        missing_record = [r.name for r in mine if r.allocated is None]
        ok = len(mine) == len(names) and not not_running and not violations and not missing_record
        return ok or NotYet(
            f"not running {not_running}; violations {violations}; no record {missing_record}"
        )

    wait_for(check, 120, f"{len(names)} pods Running with agreeing records")


def test_enabled_nodes_report_their_devices(bed: Sandbox, api: k8s_client.ApiClient) -> None:
    res = bed.protocol.resources
    states = workload.runtime_feature_states(bed.nodes)
    for node in bed.nodes:
        enabled, by = states[node.name]
        assert enabled, f"the Job Agent did not enable the Runtime of {node.name}"
        assert by.startswith("kube-system/lj-runtimekit-enable-"), by
    tdm, mig = bed.nodes
    status = _node(api, tdm.name)["status"]
    assert isinstance(status, dict)
    assert {k: status["allocatable"][k] for k in (res.gpu, res.core, res.memory)} == {
        res.gpu: "8",
        res.core: "800",
        res.memory: "800",
    }
    status = _node(api, mig.name)["status"]
    assert isinstance(status, dict)
    assert status["allocatable"][res.gpu] == "6"
    assert status["allocatable"][res.mig("1g.10gb")] == "7"
    assert status["allocatable"][res.mig("3g.40gb")] == "1"
    labels = _node(api, tdm.name)["metadata"]
    assert isinstance(labels, dict)
    assert labels["labels"][bed.protocol.labels.device_count] == "8"
    inventory = decode_inventory(labels["annotations"][bed.protocol.annotations.node_devices])
    assert len(inventory) == 8


def test_whole_slice_and_mig_pods_run_with_metrics(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    res = bed.protocol.resources
    tdm, mig = bed.nodes
    pods = [
        pod_manifest(
            "whole", {"main": {res.gpu: 2}}, node_selector={"kubernetes.io/hostname": tdm.name}
        ),
        pod_manifest("slice", {"main": {res.core: 40, res.memory: 30}}),
        pod_manifest("mig", {"main": {res.mig("1g.10gb"): 1}}),
    ]
    workload.create_pods(api, ns, pods)
    _consistent(bed, api, ns, ["whole", "slice", "mig"])
    rows = {r.name: r for r in workload.observe(bed, api, [ns])[0]}
    assert rows["mig"].node == mig.name
    assert len(rows["whole"].assigned["main"]) == 2
    assert all(s.whole for s in rows["whole"].assigned["main"])
    (share,) = rows["slice"].assigned["main"]
    assert (share.core_percent, share.memory_percent) == (40, 30)
    # The kubelet's device manager recorded exactly the assigned devices (PodResources).
    assert rows["whole"].kubelet_ids == {
        "main": {res.gpu: rows["whole"].kubelet_ids["main"][res.gpu]}
    }
    assert sorted(rows["whole"].kubelet_ids["main"][res.gpu]) == sorted(
        s.device_id for s in rows["whole"].assigned["main"]
    )

    def metrics() -> bool | NotYet:
        found = {}
        for name, row in rows.items():
            text = workload.scrape(bed.node(row.node).metrics_url)
            found[name] = workload.pod_metric_lines(text, ns, name)
        return all(found.values()) or NotYet(f"{ {k: len(v) for k, v in found.items()} }")

    wait_for(metrics, 30, "per-pod exporter series")
    text = workload.scrape(bed.node(rows["slice"].node).metrics_url)
    ratio = [
        line
        for line in workload.pod_metric_lines(text, ns, "slice")
        if line.startswith("lj_runtimekit_container_core_allocated_ratio")
    ]
    assert ratio, "no core allocation ratio series for the slice pod"
    assert ratio[0].endswith(" 0.4"), ratio


def test_invariant_holds_across_layers_for_a_burst(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    res = bed.protocol.resources
    pods = [pod_manifest(f"s{i}", {"main": {res.core: 30, res.memory: 20}}) for i in range(10)]
    pods += [pod_manifest(f"w{i}", {"main": {res.gpu: 1}}) for i in range(3)]
    workload.create_pods(api, ns, pods)
    _consistent(bed, api, ns, [p["metadata"]["name"] for p in pods])
    rows, runtime = workload.observe(bed, api, [ns])
    assert workload.invariant_violations(rows, runtime, bed.protocol) == []
    # Three 30% slices at most on one device; never a slice on a whole device.
    per_device: dict[str, int] = {}
    for row in rows:
        for shares in (row.assigned or {}).values():
            for share in shares:
                per_device[share.device_id] = per_device.get(share.device_id, 0) + (
                    share.core_percent or 100
                )
    assert max(per_device.values()) <= 100


def test_admission_failure_fails_the_pod_with_the_plugins_message(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """A slice pod bound without the scheduler (no assignment) is refused by Allocate."""
    res = bed.protocol.resources
    tdm = bed.nodes[0]
    pod = pod_manifest("unplaced", {"main": {res.core: 10, res.memory: 10}})
    pod["spec"]["nodeName"] = tdm.name
    del pod["spec"]["schedulerName"]
    workload.create_pods(api, ns, [pod])

    def failed() -> bool | NotYet:
        (row,) = workload.observe(bed, api, [ns])[0]
        return (row.phase == "Failed") or NotYet(f"{row.phase} {row.reason}")

    wait_for(failed, 60, "the unplaced slice pod to fail admission")
    (row,) = workload.observe(bed, api, [ns])[0]
    assert row.reason.startswith("UnexpectedAdmissionError")
    assert "annotation" in row.reason, row.reason
    assert "was not placed by the Runtime Kit scheduler" in row.reason, row.reason
    events = k8s_client.CoreV1Api(api).list_namespaced_event(ns).items
    assert any(e.reason == "UnexpectedAdmissionError" and e.type == "Warning" for e in events)


def test_unhealthy_device_seen_by_kubelet_scheduler_and_exporter(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    res, ann = bed.protocol.resources, bed.protocol.annotations
    tdm = bed.nodes[0]
    inventory = decode_inventory(_node(api, tdm.name)["metadata"]["annotations"][ann.node_devices])  # type: ignore[index]
    sick = next(d for d in inventory if d.index == 3)
    tdm.set_health(sick.id, healthy=False, reason="XID 79")
    try:

        def seen() -> bool | NotYet:
            node = _node(api, tdm.name)
            allocatable = node["status"]["allocatable"][res.gpu]  # type: ignore[index]
            devices = decode_inventory(node["metadata"]["annotations"][ann.node_devices])  # type: ignore[index]
            healthy = {d.id: d.healthy for d in devices}[sick.id]
            text = workload.scrape(tdm.metrics_url)
            exported = [
                line
                for line in text.splitlines()
                if line.startswith("lj_runtimekit_device_healthy{") and sick.id in line
            ]
            ok = (
                allocatable == "7"
                and not healthy
                and bool(exported)
                and exported[0].endswith(" 0.0")
            )
            return ok or NotYet(
                f"allocatable {allocatable}, inventory healthy {healthy}, exporter {exported}"
            )

        wait_for(seen, 30, "device unhealthy at kubelet, scheduler input and exporter")
        # The scheduler places a pod needing every healthy device around the sick one.
        pod = pod_manifest(
            "seven", {"main": {res.gpu: 7}}, node_selector={"kubernetes.io/hostname": tdm.name}
        )
        workload.create_pods(api, ns, [pod])
        _consistent(bed, api, ns, ["seven"])
        (row,) = workload.observe(bed, api, [ns])[0]
        assert sick.id not in {s.device_id for s in row.assigned["main"]}
    finally:
        tdm.set_health(sick.id, healthy=True)

    def recovered() -> bool | NotYet:
        allocatable = _node(api, tdm.name)["status"]["allocatable"][res.gpu]  # type: ignore[index]
        return (allocatable == "8") or NotYet(f"allocatable {allocatable}")

    wait_for(recovered, 30, "device healthy again at the kubelet")
