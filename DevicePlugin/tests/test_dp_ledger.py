"""The ledger: rebuilt from the Runtime's allocations and the pods' records; what it says
is held, asked for and clashing."""

from __future__ import annotations

from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held, Ledger, describe
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID
from lj_runtimekit.proto.pkg.runtimeclient import to_request
from lj_runtimekit.testkit.kubelet.bed import ANN, CORE, GPU, MEMORY

from .conftest import Parts, info


def test_rebuild_from_the_runtime_then_the_pods_records(parts: Parts) -> None:
    """The Runtime's allocations first (every implied resource asked for); a pod's record
    adds what the Runtime lacks, and an unreadable record is skipped."""
    ledger = Ledger(parts.rm, parts.protocol)
    sliced = DeviceShare(parts.gpu(1), 30, 0)
    allocation = rpb.Allocation(
        container_key="uid-a/main",
        pod_uid="uid-a",
        pod_namespace="default",
        pod_name="a",
        container_name="main",
        devices=[to_request(sliced)],
    )
    recorded = parts.pod(
        {"main": {GPU: 1}},
        annotations={ANN.allocated_devices: encode_assignment({"main": (DeviceShare("G"),)})},
        listed=False,
    )
    broken = parts.pod({"main": {GPU: 1}}, annotations={ANN.allocated_devices: "{"}, listed=False)
    ledger.rebuild([allocation], [info(recorded), info(broken)])
    assert set(ledger.entries) == {"uid-a/main", f"{recorded['metadata']['uid']}/main"}
    assert ledger.entries["uid-a/main"].called == {CORE, MEMORY}
    assert ledger.done() >= {("uid-a", "main", CORE), ("uid-a", "main", MEMORY)}
    assert ledger.busy() == {
        parts.gpu(1): ["uid-a/main"],
        "G": [f"{recorded['metadata']['uid']}/main"],
    }
    assert describe(ledger.entries["uid-a/main"].shares) == f"{parts.gpu(1)}(30% core, 0% memory)"


def test_a_record_copied_from_another_pod_is_not_taken_at_rebuild(parts: Parts) -> None:
    """A pod carrying another pod's annotations (its UID in them) has no allocation of its
    own: its copied record is not taken into the ledger, so its calls count as not made."""
    ledger = Ledger(parts.rm, parts.protocol)
    record = encode_assignment({"main": (DeviceShare(parts.gpu(2)),)})
    forged = parts.pod(
        {"main": {GPU: 1}},
        annotations={ANN.allocated_devices: record, ASSIGNED_POD_UID: "uid-original"},
        listed=False,
    )
    own = parts.pod({"main": {GPU: 1}}, annotations={ANN.allocated_devices: record}, listed=False)
    own["metadata"]["annotations"][ASSIGNED_POD_UID] = own["metadata"]["uid"]
    ledger.rebuild([], [info(forged), info(own)])
    assert set(ledger.entries) == {f"{own['metadata']['uid']}/main"}


def test_clash_set_follows_which_containers_run_side_by_side(parts: Parts) -> None:
    """An app container must not get devices of another app container or a sidecar of its
    pod; an init container that runs to completion may get the app containers' devices."""
    ledger = Ledger(parts.rm, parts.protocol)
    pod = info(
        parts.pod(
            {"app": {GPU: 1}, "other": {GPU: 1}},
            init_containers={"prep": {GPU: 1}},
            listed=False,
        )
    )
    for name, device, init in (("other", "G1", False), ("prep", "G2", True)):
        ledger.entries[f"{pod.uid}/{name}"] = Held(
            f"{pod.uid}/{name}",
            pod.uid,
            "default",
            pod.name,
            name,
            (DeviceShare(device),),
            {GPU},
            init=init,
        )
    app, _, prep = sorted(pod.containers, key=lambda c: c.name)
    assert ledger.clash_set(pod, app) == {"G1"}
    assert ledger.clash_set(pod, prep) == set()
    assert set(ledger.of_pod(pod.uid)) == {"other", "prep"}
