"""The pod's record: what its containers were served, and `allocated` once all were."""

from __future__ import annotations

from lj_runtimekit.deviceplugin.internal.allocate.ledger import Held
from lj_runtimekit.deviceplugin.internal.allocate.records import pod_record
from lj_runtimekit.proto.pkg.protocol import BIND_PHASE_ALLOCATED, DeviceShare, decode_assignment
from lj_runtimekit.testkit.kubelet.bed import ANN, CORE, GPU, MEMORY

from .conftest import Parts, info


def test_partial_then_complete_record(parts: Parts) -> None:
    pod = info(parts.pod({"a": {GPU: 1}, "b": {CORE: 30, MEMORY: 20}}, listed=False))
    served = parts.rm.resources()
    a = Held(f"{pod.uid}/a", pod.uid, "default", pod.name, "a", (DeviceShare("G1"),), {GPU})
    partial = pod_record(pod, {"a": a}, served, parts.protocol)
    assert partial is not None
    assert decode_assignment(partial[ANN.allocated_devices]) == {"a": (DeviceShare("G1"),)}
    assert ANN.bind_phase not in partial  # b still waits for its slice
    b = Held(
        f"{pod.uid}/b", pod.uid, "default", pod.name, "b", (DeviceShare("G2", 30, 20),), {CORE}
    )
    assert ANN.bind_phase not in (pod_record(pod, {"a": a, "b": b}, served, parts.protocol) or {})
    b.called.add(MEMORY)
    complete = pod_record(pod, {"a": a, "b": b}, served, parts.protocol)
    assert complete is not None
    assert complete[ANN.bind_phase] == BIND_PHASE_ALLOCATED
    written = parts.pod({"a": {GPU: 1}, "b": {CORE: 30, MEMORY: 20}}, annotations=complete)
    assert pod_record(info(written), {"a": a, "b": b}, served, parts.protocol) is None
