"""lj-scheduler as a process against the real control plane with KWOK GPU nodes."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory, Taint
from lj_runtimekit.proto.pkg.kube import STRATEGIC_MERGE_PATCH, KubeClient, KubeError
from lj_runtimekit.proto.pkg.protocol import decode_assignment, encode_inventory, load_protocol
from lj_runtimekit.schedulerframework.internal.cache.podinfo import parse_pod
from lj_runtimekit.schedulerframework.internal.scheduler.conditions import (
    ConditionWriter,
    status_patch,
)
from lj_runtimekit.testkit.scheduler.fake import (
    nvlink_inventory,
    preferred_affinity,
)
from lj_runtimekit.testkit.scheduler.process import (
    SchedulerProcess,
    annotate_inventory,
)
from lj_runtimekit.testkit.scheduler.process import bound_pods as bound
from lj_runtimekit.testkit.scheduler.process import pod_events as events
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("runtime_class")]
P = load_protocol()
GPU = P.resources.gpu


def check_no_double_assignment(pods: dict[str, k8s_client.V1Pod]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for name, p in pods.items():
        text = (p.metadata.annotations or {}).get(P.annotations.assigned_devices)
        assert text, f"pod {name} bound without the assignment annotation"
        for shares in decode_assignment(text).values():
            for s in shares:
                key = (p.spec.node_name, s.device_id)
                assert key not in seen, f"{key} given to {seen.get(key)} and {name}"
                seen[key] = name


def place_pod(core: k8s_client.CoreV1Api, namespace: str, manifest: dict[str, Any]) -> Any:
    """Creates the pod and waits until it is bound; the bound pod."""
    name = manifest["metadata"]["name"]
    core.create_namespaced_pod(namespace, manifest)
    wait_for(
        lambda: name in bound(core, namespace),
        60,
        f"{name} bound",
        describe=lambda: str(events(core, namespace, name)),
    )
    return bound(core, namespace)[name]


def test_places_on_devices_with_one_binding_write(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    node = node_factory.create(f"{namespace}-n0")
    annotate_inventory(core, node)
    name = f"lj-{namespace}"
    core.create_namespaced_pod(namespace, pod("four", name, node_factory.selector, {GPU: "4"}))
    wait_for(lambda: "four" in bound(core, namespace), 60, "pod bound", describe=scheduler.text)
    p = bound(core, namespace)["four"]
    shares = decode_assignment(p.metadata.annotations[P.annotations.assigned_devices])["main"]
    assert sorted(s.device_id for s in shares) == [f"{node}-gpu{i}" for i in range(4)]
    assert p.metadata.annotations[P.annotations.bind_phase] == "allocating"
    # bad inputs stay Pending with a reason; the scheduler keeps running
    bad = {
        "slice": ({P.resources.core: "150", P.resources.memory: "10"}, "a slice is at most 100"),
        "mixed": ({GPU: "1", P.resources.core: "10"}, "mixes whole devices"),
        "huge": ({GPU: "64"}, "the largest node has 8"),
    }
    for bad_name, (limits, _) in bad.items():
        core.create_namespaced_pod(namespace, pod(bad_name, name, node_factory.selector, limits))
    core.create_namespaced_pod(
        namespace,
        pod(
            "override",
            name,
            node_factory.selector,
            {GPU: "1"},
            annotations={P.annotations.gpu_policy: "nope"},
        ),
    )
    bad["override"] = ({}, "is not one of binpack, spread")
    core.create_namespaced_pod(
        namespace, pod("norc", name, node_factory.selector, {GPU: "1"}, runtime_class=None)
    )
    for bad_name, (_, text) in bad.items():
        wait_for(
            lambda bad_name=bad_name, text=text: any(  # type: ignore[misc]
                "FailedScheduling" in e and text in e for e in events(core, namespace, bad_name)
            ),
            30,
            f"FailedScheduling event of {bad_name}",
            describe=lambda bad_name=bad_name: str(events(core, namespace, bad_name)),  # type: ignore[misc]
        )
    wait_for(lambda: "norc" in bound(core, namespace), 30, "pod without runtime class bound")
    assert any("MissingRuntimeClass" in e for e in events(core, namespace, "norc"))
    assert set(bound(core, namespace)) == {"four", "norc"}


def test_restart_mid_burst_rebuilds_state(
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    nodes = [node_factory.create(f"{namespace}-n{i}", wait=False) for i in range(3)]
    node_factory.wait_ready(nodes)
    for n in nodes[:2]:
        annotate_inventory(core, n)  # the third schedules from its capacity
    name = f"lj-{namespace}"
    for i in range(30):
        core.create_namespaced_pod(namespace, pod(f"p{i}", name, node_factory.selector, {GPU: "1"}))
    wait_for(lambda: len(bound(core, namespace)) >= 5, 60, "first binds", describe=scheduler.text)
    scheduler.kill()
    partial = len(bound(core, namespace))
    replacement = SchedulerProcess(control_plane.kubeconfig_path, name).start()
    try:
        for i in range(30, 36):
            core.create_namespaced_pod(
                namespace, pod(f"p{i}", name, node_factory.selector, {GPU: "1"})
            )
        wait_for(
            lambda: len(bound(core, namespace)) == 24,
            90,
            "24 of 36 pods bound",
            describe=lambda: f"{len(bound(core, namespace))} bound; {replacement.text()[-2000:]}",
        )
        time.sleep(1.0)  # a double booking would show up as a 25th bind
        pods = bound(core, namespace)
        assert len(pods) == 24, f"{partial} bound before the restart"
        check_no_double_assignment(pods)
        pending = [
            p.metadata.name
            for p in core.list_namespaced_pod(namespace).items
            if not p.spec.node_name
        ]
        assert len(pending) == 12
        wait_for(
            lambda: any(
                "Insufficient alibabacloud.com/gpu" in e
                for e in events(core, namespace, pending[0])
            ),
            30,
            "FailedScheduling of a pending pod",
            describe=lambda: str(events(core, namespace, pending[0])),
        )
    finally:
        replacement.stop()


def test_two_replicas_one_leader(
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    coord = k8s_client.CoordinationV1Api(api_client)
    node_factory.create(f"{namespace}-n0")
    name = f"lj-{namespace}"
    cfg = Path(tempfile.mkdtemp(prefix="ljcfg")) / "config.yaml"
    cfg.write_text(
        json.dumps(
            {
                "apiVersion": "scheduler.lingjun.com/v1",
                "kind": "LjSchedulerConfiguration",
                "leaderElection": {
                    "leaderElect": True,
                    "resourceName": name,
                    "resourceNamespace": namespace,
                    "leaseDuration": "4s",
                    "renewDeadline": "3s",
                    "retryPeriod": "1s",
                },
            }
        )
    )
    replicas = [
        SchedulerProcess(
            control_plane.kubeconfig_path,
            name,
            f"--config={cfg}",
            "--leader-elect=true",
            f"--identity=replica-{i}",
        ).start()
        for i in range(2)
    ]
    try:

        def holder() -> str:
            try:
                return str(coord.read_namespaced_lease(name, namespace).spec.holder_identity or "")
            except k8s_client.ApiException:
                return ""

        wait_for(
            lambda: holder().startswith("replica-"),
            60,
            "a leader",
            describe=lambda: replicas[0].text()[-1500:],
        )
        leader = int(holder().rsplit("-", 1)[1])
        time.sleep(2.5)
        assert holder() == f"replica-{leader}"  # renewed, not stolen
        core.create_namespaced_pod(namespace, pod("a", name, node_factory.selector, {GPU: "1"}))
        wait_for(lambda: "a" in bound(core, namespace), 30, "pod bound by the leader")
        assert "became leader" in replicas[leader].text()
        assert "became leader" not in replicas[1 - leader].text()
        replicas[leader].kill()
        wait_for(lambda: holder() == f"replica-{1 - leader}", 30, "standby takes over")
        core.create_namespaced_pod(namespace, pod("b", name, node_factory.selector, {GPU: "1"}))
        wait_for(lambda: "b" in bound(core, namespace), 30, "pod bound by the new leader")
    finally:
        for r in replicas:
            r.stop()


def test_policies_mig_and_topology_on_kwok_nodes(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    nodes = [node_factory.create(f"{namespace}-n{i}", wait=False) for i in range(2)]
    node_factory.wait_ready(nodes)
    mig_res = P.resources.mig("3g.40gb")
    for n in nodes:
        inv = nvlink_inventory(n, mig={7: ["3g.40gb", "4g.40gb"]})
        core.patch_node(
            n, {"metadata": {"annotations": {P.annotations.node_devices: encode_inventory(inv)}}}
        )
        core.patch_node_status(
            n, {"status": {"capacity": {mig_res: "1"}, "allocatable": {mig_res: "1"}}}
        )
    name = f"lj-{namespace}"
    sel = node_factory.selector
    spread = {P.annotations.gpu_policy: "spread"}

    def place(pod_name: str, limits: dict[str, str], **extra: Any) -> Any:
        p = place_pod(core, namespace, pod(pod_name, name, sel, limits, **extra))
        shares = decode_assignment(p.metadata.annotations[P.annotations.assigned_devices])["main"]
        return p.spec.node_name, shares

    first, one = place("a", {GPU: "1"})
    # gpu7 is in MIG mode, so island 4-7 is broken already: a single GPU comes from it
    assert one[0].device_id == f"{first}-gpu4"
    second, _ = place("b", {GPU: "1"})  # binpack: same node
    assert second == first
    third, _ = place("c", {GPU: "1"}, annotations=spread)  # per-pod spread: the other node
    assert third != first
    node4, four = place("d", {GPU: "4"})
    # binpack onto the fuller node, on its intact NVLink island 0-3
    assert node4 == first
    assert sorted(s.device_id for s in four) == [f"{first}-gpu{i}" for i in range(4)]
    mig_node, mig = place("m", {mig_res: "1"})
    assert mig[0].device_id == f"{mig_node}-gpu7-mig0"
    slices = [place(f"s{i}", {P.resources.core: "60", P.resources.memory: "10"}) for i in range(2)]
    for node_name, shares in slices:
        assert not shares[0].device_id.startswith(f"{node_name}-gpu7")  # never on the MIG GPU
    assert slices[0][1][0].device_id != slices[1][1][0].device_id or (
        slices[0][0] != slices[1][0]
    )  # 60 % + 60 % never on one device


def test_preferred_affinity_and_prefer_no_schedule_on_kwok_nodes(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    plain = node_factory.create(f"{namespace}-plain", wait=False, labels={"zone": "z1"})
    soft = node_factory.create(
        f"{namespace}-soft",
        wait=False,
        labels={"zone": "z2"},
        taints=(Taint("dedicated", "PreferNoSchedule", "infra"),),
    )
    node_factory.wait_ready([plain, soft])
    for n in (plain, soft):
        annotate_inventory(core, n)
    name = f"lj-{namespace}"
    sel = node_factory.selector

    def place(pod_name: str, **extra: Any) -> str:
        p = place_pod(core, namespace, pod(pod_name, name, sel, {GPU: "1"}, **extra))
        return str(p.spec.node_name)

    tolerate = [{"key": "dedicated", "operator": "Equal", "value": "infra"}]
    # Three tolerating pods pinned to the tainted node: binpack now pulls towards it.
    for i in range(3):
        assert place(f"infra{i}", tolerations=tolerate, nodeSelector={**sel, "zone": "z2"}) == soft
    assert place("plain") == plain  # an untolerated PreferNoSchedule taint outweighs binpack
    assert place("tolerant", tolerations=tolerate) == soft  # tolerated: binpack decides
    # Binpack pulls to the fuller tainted node (tolerated here); the preference for z1 wins.
    prefer_z1 = preferred_affinity((100, "zone", "z1"))
    assert place("prefers-z1", affinity=prefer_z1, tolerations=tolerate) == plain


def test_an_unschedulable_pod_shows_pod_scheduled_false_until_it_is_bound(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    node = node_factory.create(f"{namespace}-n0")
    annotate_inventory(core, node)
    name = f"lj-{namespace}"
    selector = {**node_factory.selector, "gpu-ready": "yes"}  # no node has it yet
    core.create_namespaced_pod(namespace, pod("waits", name, selector, {GPU: "1"}))

    def condition() -> Any:
        p = core.read_namespaced_pod("waits", namespace)
        found = [c for c in p.status.conditions or () if c.type == "PodScheduled"]
        return found[0] if found else None

    wait_for(
        lambda: condition() is not None,
        60,
        "PodScheduled written",
        describe=lambda: str(events(core, namespace, "waits")),
    )
    c = condition()
    assert (c.status, c.reason) == ("False", "Unschedulable")
    assert "nodes are available" in c.message
    assert "node(s) didn't match Pod's node affinity/selector" in c.message

    def failures() -> int:
        return sum(
            e.count or 1
            for e in core.list_namespaced_event(namespace).items
            if e.involved_object.name == "waits" and e.reason == "FailedScheduling"
        )

    # a change of the pod itself that does not help: tried again at once (a node change that
    # cannot help, such as an unrelated label, does not move it: per-plugin queueing hints);
    # same reason, so the condition is not written again
    core.patch_namespaced_pod("waits", namespace, {"metadata": {"labels": {"unrelated": "x"}}})
    version = core.read_namespaced_pod("waits", namespace).metadata.resource_version
    wait_for(lambda: failures() >= 2, 60, "a second attempt", describe=scheduler.text)
    time.sleep(1.0)  # a write would follow the attempt at once: give it the chance to show
    assert core.read_namespaced_pod("waits", namespace).metadata.resource_version == version
    assert condition().last_transition_time == c.last_transition_time
    core.patch_node(node, {"metadata": {"labels": {"gpu-ready": "yes"}}})
    wait_for(lambda: "waits" in bound(core, namespace), 60, "pod bound", describe=scheduler.text)
    wait_for(lambda: condition().status == "True", 30, "PodScheduled=True after the Binding")
    # a write decided on the pod before it was bound is refused: it never marks the bound pod
    stale = status_patch(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "x"},
        version,
    )
    with pytest.raises(KubeError) as refused:
        KubeClient(api_client).request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/waits/status",
            body=stale,
            content_type=STRATEGIC_MERGE_PATCH,
        )
    assert refused.value.status == 409
    assert condition().status == "True"


def test_a_condition_decided_on_a_changed_pod_is_written_unless_it_was_bound(
    api_client: k8s_client.ApiClient, namespace: str
) -> None:
    kube = KubeClient(api_client)
    writer = ConditionWriter(kube)
    base = f"/api/v1/namespaces/{namespace}/pods"
    stale: dict[str, dict[str, Any]] = {}
    for name in ("changed", "bound", "recreated", "last"):
        manifest = pod(name, "nobody", {}, {})  # no scheduler of that name: it stays pending
        stale[name] = kube.request("POST", base, body=manifest)

    def message(name: str) -> str | None:
        conditions = kube.request("GET", f"{base}/{name}").get("status", {}).get("conditions")
        found = [c for c in conditions or () if c["type"] == "PodScheduled"]
        return f"{found[0]['status']}: {found[0].get('message', '')}" if found else None

    try:
        # both change after the failure was decided; one is bound meanwhile
        for name in ("changed", "bound"):
            label = {"metadata": {"labels": {"x": "y"}}}
            kube.request("PATCH", f"{base}/{name}", body=label, content_type=STRATEGIC_MERGE_PATCH)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "bound"},
            "target": {"kind": "Node", "name": "elsewhere"},
        }
        kube.request("POST", f"{base}/bound/binding", body=binding)
        # and one is deleted and made again under its name: another pod
        kube.request("DELETE", f"{base}/recreated")

        def deleted() -> bool:
            try:
                kube.request("GET", f"{base}/recreated")
            except KubeError as exc:
                return exc.status == 404
            return False

        wait_for(deleted, 30, "recreated deleted")
        kube.request("POST", base, body=pod("recreated", "nobody", {}, {}))
        for name in ("changed", "bound", "recreated", "last"):
            writer.unschedulable(parse_pod(stale[name]), "Unschedulable", f"{name}: no room")
        # one thread writes in order: once the last is there, the others were decided
        wait_for(lambda: message("last") == "False: last: no room", 30, "the last condition")
        assert message("changed") == "False: changed: no room"
        assert message("bound") == "True: "
        assert message("recreated") is None
    finally:
        writer.stop()
