"""Garbage collection: finished pods' allocations go at once, vanished ones after the grace
(the kubelet's list) or at once (the API server's)."""

from __future__ import annotations

from lj_runtimekit.deviceplugin.internal.allocate.collect import Collector
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import GPU

from .conftest import Parts, allocate_request, info


async def test_release_finished_and_vanished_pods(parts: Parts) -> None:
    allocator = parts.allocator()
    ledger = allocator.ledger
    pods = [
        parts.pod(
            {"main": {GPU: 1}}, {"main": [DeviceShare(parts.gpu(i))]}, name=f"p{i}", listed=False
        )
        for i in range(3)
    ]
    for i, pod in enumerate(pods):
        parts.kubelet_pods.put(pod)  # admitted one at a time
        await allocator.allocate(GPU, allocate_request([parts.gpu(i)]))
    finished = {**pods[0], "status": {"phase": "Succeeded"}}
    kept = Collector(ledger, parts.runtime, release_grace_s=3600)
    # p0 finished, p1 running, p2 gone from the kubelet's list: within the grace, p2 stays.
    await kept.release_finished([info(finished), info(pods[1])], fresh=False)
    assert sorted(h.name for h in ledger.entries.values()) == ["p1", "p2"]
    assert ledger.missing()
    # The API server's list says p2 is gone: released at once, in the Runtime too.
    await kept.release_finished([info(pods[1])], fresh=True)
    assert [h.name for h in ledger.entries.values()] == ["p1"]
    runtime = await parts.runtime.client.list_allocations()
    assert [a.pod_name for a in runtime] == ["p1"]
    assert not ledger.missing()
