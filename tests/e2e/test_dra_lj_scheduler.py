"""lj-scheduler allocates DRA claims on our ResourceSlices and DeviceClasses.

The DRA bed of `test_dra_kube_scheduler.py` (a control plane of the DRA mode's release,
three KWOK nodes publishing the simulator's example inventories as slices, our classes),
with lj-scheduler placing the pods instead of kube-scheduler: claims made from templates by
the controller manager, allocated and reserved by lj-scheduler's PreBind, read back into
Runtime shares; after every test the claims of the whole cluster are checked against the
sharing invariant.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lj_runtimekit.deviceplugin.internal.dra.classes import profile_selector
from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY, memory_step
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.dra import (
    RESOURCE_API,
    DraCluster,
    DraSpace,
    exactly,
    example_devices,
)
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

PROTOCOL = load_protocol()
DRIVER = PROTOCOL.dra.driver
WHOLE = PROTOCOL.dra.whole_class("gpu")
SHARE = PROTOCOL.dra.share_class("gpu")
NAME = "lj-dra"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


@pytest.fixture(scope="module")
def lj_scheduler(dra_cluster: DraCluster) -> Iterator[SchedulerProcess]:
    process = SchedulerProcess(dra_cluster.kubeconfig, NAME).start()
    yield process
    process.stop()


def _share(percent: int) -> dict[str, Any]:
    step = memory_step(example_devices("tdm-8gpu")[0])
    return exactly("s", SHARE, capacity={CORES: str(percent), MEMORY: str(percent * step)})


def _claim(space: DraSpace, name: str) -> dict[str, Any]:
    return space.kube.request(
        "GET", f"{RESOURCE_API}/namespaces/{space.namespace}/resourceclaims/{name}"
    )


def _claim_of(space: DraSpace, pod: dict[str, Any], entry: str) -> dict[str, Any]:
    (name,) = [
        s["resourceClaimName"]
        for s in pod["status"].get("resourceClaimStatuses") or ()
        if s["name"] == entry
    ]
    return _claim(space, name)


def test_whole_gpus_allocated_reserved_and_protected(
    dra_space: DraSpace, lj_scheduler: SchedulerProcess
) -> None:
    dra_space.template("two", [exactly("g", WHOLE, count=2)])
    dra_space.pod("whole", {"g": "two"}, containers=({"main": ("g",)},), scheduler_name=NAME)
    pod = dra_space.running("whole")
    (shares,) = dra_space.claims_of(pod).values()
    assert len({ref.runtime_id for _, ref, _ in shares}) == 2
    claim = _claim_of(dra_space, pod, "g")
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "whole", "uid": pod["metadata"]["uid"]}
    ]
    assert DELETE_PROTECTION in claim["metadata"]["finalizers"]
    events = dra_space.kube.request(
        "GET",
        f"/api/v1/namespaces/{dra_space.namespace}/events",
        query={"fieldSelector": "involvedObject.name=whole,reason=Scheduled"},
    )["items"]
    assert [e["reportingComponent"] for e in events] == [NAME]  # lj-scheduler placed it


def test_tdm_slices_pack_one_gpu(dra_space: DraSpace, lj_scheduler: SchedulerProcess) -> None:
    dra_space.template("s30", [_share(30)])
    for n in range(3):
        dra_space.pod(f"s{n}", {"s": "s30"}, containers=({"main": ("s",)},), scheduler_name=NAME)
    pods = [dra_space.running(f"s{n}") for n in range(3)]
    devices = {
        (p["spec"]["nodeName"], ref.runtime_id)
        for p in pods
        for shares in dra_space.claims_of(p).values()
        for _, ref, _ in shares
    }
    assert len(devices) == 1, devices  # binpack: the fullest GPU that fits


def test_claim_shared_by_two_pods_is_allocated_once(
    dra_space: DraSpace, lj_scheduler: SchedulerProcess
) -> None:
    mig = example_devices("mig-8gpu")
    profile = next(i.profile for d in mig for i in d.mig_instances)
    request = exactly("m", PROTOCOL.dra.mig_class, selector=profile_selector(PROTOCOL, profile))
    dra_space.kube.request(
        "POST",
        f"{RESOURCE_API}/namespaces/{dra_space.namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared"},
            "spec": {"devices": {"requests": [request]}},
        },
    )
    for name in ("a", "b"):
        dra_space.pod(
            name, {}, named={"m": "shared"}, containers=({"main": ("m",)},), scheduler_name=NAME
        )
    pods = [dra_space.running(name) for name in ("a", "b")]
    assert {p["spec"]["nodeName"] for p in pods} == {"dra-mig"}
    claim = _claim(dra_space, "shared")
    assert len(claim["status"]["allocation"]["devices"]["results"]) == 1
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["a", "b"]


def test_claim_for_another_drivers_class_stays_pending_saying_why(
    dra_space: DraSpace, lj_scheduler: SchedulerProcess
) -> None:
    other = "gpu.example.com"
    dra_space.kube.request(
        "POST",
        f"{RESOURCE_API}/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"{other}-{dra_space.namespace}"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{other}"'}}]},
        },
    )
    dra_space.template("other", [exactly("g", f"{other}-{dra_space.namespace}")])
    dra_space.pod("other", {"g": "other"}, containers=({"main": ("g",)},), scheduler_name=NAME)

    def refused() -> dict[str, Any] | NotYet:
        # first "waiting for the ResourceClaim ... to be made", until the controller made it
        pod = dra_space.get("other")
        conditions = pod["status"].get("conditions") or ()
        found = [c for c in conditions if c["type"] == "PodScheduled"]
        if found and "cannot allocate ResourceClaim" in found[0].get("message", ""):
            return found[0]
        return NotYet(str(found))

    condition = wait_for(refused, 60, "pod other refused for its claim", describe=lj_scheduler.text)
    assert condition["reason"] == "Unschedulable"
    assert not dra_space.get("other")["spec"].get("nodeName")


def test_a_pod_that_cannot_fit_stays_pending(
    dra_space: DraSpace, lj_scheduler: SchedulerProcess
) -> None:
    dra_space.template("many", [exactly("g", WHOLE, count=15)])
    dra_space.pod("many", {"g": "many"}, containers=({"main": ("g",)},), scheduler_name=NAME)
    pod = dra_space.settled("many")
    assert not pod["spec"].get("nodeName")
    claim = _claim_of(dra_space, pod, "g")
    assert not claim.get("status", {}).get("allocation")


def test_burst_through_a_scheduler_kill_never_shares_a_device(
    dra_space: DraSpace, lj_scheduler: SchedulerProcess
) -> None:
    """Whole GPUs and slices for every GPU of the TDM node, the scheduler killed in the
    middle and started again: every pod runs, the claims never overlap (the fixture's
    invariant check), and the claims that lj-scheduler allocated before it died are
    honoured, not allocated twice."""
    dra_space.template("one", [exactly("g", WHOLE)])
    dra_space.template("half", [_share(50)])
    names = [f"w{n}" for n in range(4)] + [f"h{n}" for n in range(8)]
    for name in names:
        template = "one" if name[0] == "w" else "half"
        dra_space.pod(
            name,
            {"g": template},
            containers=({"main": ("g",)},),
            scheduler_name=NAME,
            node="dra-tdm",
        )

    def some_bound() -> bool | NotYet:
        bound = [n for n in names if dra_space.get(n)["spec"].get("nodeName")]
        return True if len(bound) >= 3 else NotYet(f"bound: {bound}")

    wait_for(some_bound, 60, "a few pods bound", describe=lj_scheduler.text)
    lj_scheduler.kill()
    lj_scheduler.start()
    pods = [dra_space.running(n) for n in names]
    used = [
        ref.runtime_id
        for p in pods
        for shares in dra_space.claims_of(p).values()
        for _, ref, _ in shares
    ]
    assert len(used) == 12
    assert len(set(used)) == 8  # 4 whole GPUs, 4 GPUs of two halves


def _gang(dra_space: DraSpace, group: str, members: int, template: str) -> list[str]:
    names = [f"{group}-{n}" for n in range(members)]
    annotations = {
        PROTOCOL.annotations.gang_group: group,
        PROTOCOL.annotations.gang_min_members: str(members),
    }
    for name in names:
        dra_space.pod(
            name,
            {"g": template},
            containers=({"main": ("g",)},),
            scheduler_name=NAME,
            node="dra-tdm",
            annotations=annotations,
        )
    return names


def _tried(dra_space: DraSpace, names: list[str], scheduler: SchedulerProcess) -> None:
    """Waits until every pod has been turned away at least once (PodScheduled=False)."""

    def check() -> bool | NotYet:
        waiting = [
            n
            for n in names
            if not any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in dra_space.get(n)["status"].get("conditions") or ()
            )
        ]
        return True if not waiting else NotYet(f"not tried yet: {waiting}")

    wait_for(check, 60, f"pods {names} turned away", describe=lambda: scheduler.text()[-3000:])


def _claims_allocated(dra_space: DraSpace, names: list[str]) -> list[str]:
    allocated = []
    for name in names:
        for status in dra_space.get(name)["status"].get("resourceClaimStatuses") or ():
            claim = _claim(dra_space, status["resourceClaimName"])
            if claim.get("status", {}).get("allocation"):
                allocated.append(claim["metadata"]["name"])
    return allocated


def test_gang_with_claims_is_placed_whole_or_not_at_all(
    dra_space: DraSpace, lj_scheduler: SchedulerProcess
) -> None:
    dra_space.template("two", [exactly("g", WHOLE, count=2)])
    first = _gang(dra_space, "first", 3, "two")  # 6 of the TDM node's 8 GPUs
    for name in first:
        dra_space.running(name)
    second = _gang(dra_space, "second", 2, "two")  # needs 4: only 2 left
    _tried(dra_space, second, lj_scheduler)
    assert not any(dra_space.get(n)["spec"].get("nodeName") for n in second)
    assert _claims_allocated(dra_space, second) == []  # no member's claim was written
    for name in first:
        dra_space.kube.request(
            "DELETE",
            f"/api/v1/namespaces/{dra_space.namespace}/pods/{name}",
            query={"gracePeriodSeconds": "0"},
        )
    pods = [dra_space.running(n) for n in second]  # the freed GPUs take the gang whole
    used = {
        ref.runtime_id
        for p in pods
        for shares in dra_space.claims_of(p).values()
        for _, ref, _ in shares
    }
    assert len(used) == 4


def test_preemption_frees_a_victims_claim(
    dra_space: DraSpace, lj_scheduler: SchedulerProcess
) -> None:
    low, high = f"{dra_space.namespace}-low", f"{dra_space.namespace}-high"
    for name, value in ((low, 10), (high, 1000)):
        dra_space.kube.request(
            "POST",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    dra_space.template("two", [exactly("g", WHOLE, count=2)])
    lows = [f"low-{n}" for n in range(4)]  # the TDM node's 8 GPUs
    for name in lows:
        dra_space.pod(
            name,
            {"g": "two"},
            containers=({"main": ("g",)},),
            scheduler_name=NAME,
            node="dra-tdm",
            priority_class=low,
        )
    for name in lows:
        dra_space.running(name)
    dra_space.pod(
        "high",
        {"g": "two"},
        containers=({"main": ("g",)},),
        scheduler_name=NAME,
        node="dra-tdm",
        priority_class=high,
    )
    pod = dra_space.running("high")
    assert pod["spec"]["nodeName"] == "dra-tdm"
    remaining = dra_space.kube.request("GET", f"/api/v1/namespaces/{dra_space.namespace}/pods")[
        "items"
    ]
    running_lows = [
        p["metadata"]["name"]
        for p in remaining
        if p["metadata"]["name"].startswith("low-") and not p["metadata"].get("deletionTimestamp")
    ]
    assert len(running_lows) == 3, running_lows  # one victim, the fewest that free 2 GPUs
