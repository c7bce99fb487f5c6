"""Sidecars (restartable init containers) on the real kubelet: a sidecar declared before an
init container runs beside it, so the kubelet's device manager holds both at once; the
scheduler must count (and place) the pod the same way."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.proto.pkg.protocol import pod_shares
from lj_runtimekit.sandbox import Sandbox, workload
from lj_runtimekit.sandbox.workload import pod_manifest
from lj_runtimekit.testkit.invariant import checkpoint_specs, foreign_specs, init_containers
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

BED_KINDS = ("tdm-8gpu",)


def test_a_sidecar_before_an_init_container_is_counted_as_the_kubelet_holds_it(
    bed: Sandbox, api: k8s_client.ApiClient, ns: str
) -> None:
    """Whole GPUs and slices: each pod is placed, admitted and runs; the kubelet holds (its
    device checkpoint, every container) exactly what the scheduler counts for the pod, and
    every running container got its own spec."""
    res = bed.protocol.resources
    node = bed.nodes[0]
    pin = {"kubernetes.io/hostname": node.name}
    pods = [
        pod_manifest(
            "side-whole",
            {"main": {res.gpu: 1}},
            init_containers={"side": {res.gpu: 2}, "prep": {res.gpu: 2}},
            sidecars={"side"},
            node_selector=pin,
        ),
        pod_manifest(
            "side-slice",
            {"main": {res.core: 20, res.memory: 20}},
            init_containers={
                "side": {res.core: 20, res.memory: 20},
                "prep": {res.core: 50, res.memory: 40},
                "late": {res.core: 10, res.memory: 10},
            },
            sidecars={"side", "late"},
            node_selector=pin,
        ),
    ]
    workload.create_pods(api, ns, pods)

    def settled() -> bool | NotYet:
        rows, runtime = workload.observe(bed, api, [ns])
        phases = {r.name: (r.phase, r.reason) for r in rows}
        problems = workload.invariant_violations(rows, runtime, bed.protocol)
        running = all(r.phase == "Running" and r.allocated is not None for r in rows)
        return (running and len(rows) == 2 and not problems) or NotYet(f"{phases} {problems}")

    wait_for(settled, 90, "both pods running, the four ledgers agreeing")
    listed = {p["metadata"]["name"]: p for p in workload.list_pods(api, ns)}
    specs = checkpoint_specs((node.plugin_dir / "kubelet_internal_checkpoint").read_text())
    held: dict[str, dict[str, set[str]]] = {}
    for spec in specs:
        held.setdefault(spec.pod_uid, {}).setdefault(spec.resource, set()).update(spec.device_ids)

    whole_pod = listed["side-whole"]
    assigned = workload.placements([whole_pod], bed.protocol)[0].assigned or {}
    counted = pod_shares(assigned, init_containers(whole_pod))
    kubelet = held[whole_pod["metadata"]["uid"]]
    assert len(counted) == 4  # side 2 + prep 2 at once
    assert kubelet[res.gpu] == {s.device_id for s in counted}

    slice_pod = listed["side-slice"]
    assigned = workload.placements([slice_pod], bed.protocol)[0].assigned or {}
    (share,) = pod_shares(assigned, init_containers(slice_pod))
    kubelet = held[slice_pod["metadata"]["uid"]]
    # core: max(side 20 + prep 50, side 20 + late 10 + main 20); memory: max(20 + 40, 50)
    assert (share.core_percent, share.memory_percent) == (70, 60)
    assert (len(kubelet[res.core]), len(kubelet[res.memory])) == (70, 60)
    assert {u.rpartition("::")[0] for u in kubelet[res.core] | kubelet[res.memory]} == {
        share.device_id
    }
    assert foreign_specs(specs, listed.values(), bed.protocol) == []
