"""Extender mode through the real kube-scheduler (config/extender sample), and bad JSON."""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.envtest.process import Process
from lj_runtimekit.proto.pkg.protocol import decode_assignment, load_protocol
from lj_runtimekit.testkit.ports import free_port
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
SAMPLE = Path(__file__).parent.parent / "config" / "extender" / "kube-scheduler-config.yaml"


@pytest.fixture
def extender(control_plane: ControlPlane, namespace: str) -> Iterator[tuple[SchedulerProcess, int]]:
    port = free_port()
    s = SchedulerProcess(
        control_plane.kubeconfig_path,
        f"lj-{namespace}",
        "--mode=extender",
        f"--extender-port={port}",
        "--extender-address=127.0.0.1",
    ).start()
    wait_for(lambda: "extender serving" in s.text(), 60, "extender serving", describe=s.text)
    yield s, port
    s.stop()


@pytest.fixture
def kube_scheduler(
    control_plane: ControlPlane, namespace: str, extender: tuple[SchedulerProcess, int]
) -> Iterator[str]:
    """The stock kube-scheduler with the sample config, pointed at the extender."""
    doc = yaml.safe_load(SAMPLE.read_text())
    name = f"ext-{namespace}"
    doc["clientConnection"]["kubeconfig"] = str(control_plane.kubeconfig_path)
    doc["profiles"][0]["schedulerName"] = name
    doc["leaderElection"] = {"leaderElect": False}
    ext = doc["extenders"][0]
    ext["urlPrefix"] = f"http://127.0.0.1:{extender[1]}"  # loopback: plain HTTP is allowed
    ext["enableHTTPS"] = False
    del ext["tlsConfig"]
    work = Path(tempfile.mkdtemp(prefix="ljext"))
    (work / "config.yaml").write_text(yaml.safe_dump(doc))
    proc = Process(
        "kube-scheduler",
        control_plane.kube_scheduler_argv(work / "config.yaml"),
        work / "kube-scheduler.log",
    )
    proc.start()
    yield name
    proc.stop()


def test_kube_scheduler_places_devices_through_the_extender(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    extender: tuple[SchedulerProcess, int],
    kube_scheduler: str,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    nodes = [node_factory.create(f"{namespace}-n{i}", wait=False) for i in range(2)]
    node_factory.wait_ready(nodes)
    for n in nodes:
        annotate_inventory(core, n)
    # binpack: both pods on one node, on distinct devices; a slice goes to a free device
    for i in range(2):
        core.create_namespaced_pod(
            namespace, pod(f"w{i}", kube_scheduler, node_factory.selector, {GPU: "2"})
        )
    wait_for(
        lambda: len(bound(core, namespace)) == 2,
        90,
        "kube-scheduler binds via extender",
        describe=lambda: extender[0].text()[-3000:],
    )
    pods = bound(core, namespace)
    devices = set()
    for p in pods.values():
        text = p.metadata.annotations[P.annotations.assigned_devices]
        devices |= {(p.spec.node_name, s.device_id) for s in decode_assignment(text)["main"]}
    assert len(devices) == 4
    assert len({p.spec.node_name for p in pods.values()}) == 1  # GpuShare binpack score
    # a bad input answered by the extender shows in kube-scheduler's event
    core.create_namespaced_pod(
        namespace,
        pod(
            "big-slice",
            kube_scheduler,
            node_factory.selector,
            {P.resources.core: "150", P.resources.memory: "10"},
        ),
    )
    wait_for(
        lambda: any("a slice is at most 100" in e for e in events(core, namespace, "big-slice")),
        60,
        "FailedScheduling with the extender's reason",
        describe=lambda: str(events(core, namespace, "big-slice")),
    )
    assert "big-slice" not in bound(core, namespace)


def post(port: int, verb: str, data: bytes) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/{verb}",
        data=data,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_extender_rejects_malformed_json(extender: tuple[SchedulerProcess, int]) -> None:
    _, port = extender
    code, body = post(port, "filter", b"{not json")
    assert code == 400
    assert "request body is not valid JSON" in str(body["Error"])
    code, body = post(port, "filter", b'{"pod": {"metadata": {"name": "x"}}}')
    assert code == 400
    assert body["Error"] == "neither NodeNames nor Nodes given"
    code, body = post(port, "bind", b'{"podname": "x"}')
    assert code == 400
    assert "PodNamespace" in str(body["Error"])
    # keys are read case-insensitively
    code, body = post(
        port,
        "filter",
        json.dumps(
            {
                "pod": {"metadata": {"name": "x", "uid": "u"}, "spec": {"containers": []}},
                "nodenames": ["nowhere"],
            }
        ).encode(),
    )
    assert code == 200
    assert body["NodeNames"] == []
    assert "nowhere" in body["FailedNodes"]  # type: ignore[operator]


def test_gangs_and_filtered_nodes_are_refused_not_bound(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    extender: tuple[SchedulerProcess, int],
    kube_scheduler: str,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    node = node_factory.create(f"{namespace}-n0")
    annotate_inventory(core, node)
    a = P.annotations
    gang = {a.gang_group: "train", a.gang_min_members: "2"}
    for i in range(2):
        core.create_namespaced_pod(
            namespace,
            pod(f"m{i}", kube_scheduler, node_factory.selector, {GPU: "1"}, annotations=gang),
        )
    refusal = "gangs need lj-scheduler profile, extender mode cannot place all-or-nothing"
    wait_for(
        lambda: any(refusal in e for e in events(core, namespace, "m0")),
        60,
        "FailedScheduling naming the gang refusal",
        describe=lambda: str(events(core, namespace, "m0")),
    )
    # a bind asked for a node the pod's Filter rejects (its nodeSelector) is refused
    lone = core.create_namespaced_pod(
        namespace, pod("lone", "nobody", {"zone": "elsewhere"}, {GPU: "1"})
    )
    code, body = post(
        extender[1],
        "bind",
        json.dumps(
            {
                "PodName": "lone",
                "PodNamespace": namespace,
                "PodUID": lone.metadata.uid,
                "Node": node,
            }
        ).encode(),
    )
    assert code == 200
    assert "cannot be bound to node" in str(body["Error"])
    assert "didn't match Pod's node affinity/selector" in str(body["Error"])
    assert bound(core, namespace) == {}


def test_a_bind_sent_twice_keeps_the_bound_pods_devices(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    extender: tuple[SchedulerProcess, int],
) -> None:
    # A caller that timed out on a Binding which landed sends the bind again.
    core = k8s_client.CoreV1Api(api_client)
    node = node_factory.create(f"{namespace}-n0")
    annotate_inventory(core, node)

    def bind_request(name: str, uid: str) -> tuple[int, dict[str, object]]:
        body = {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node}
        return post(extender[1], "bind", json.dumps(body).encode())

    first = core.create_namespaced_pod(
        namespace, pod("first", "nobody", node_factory.selector, {GPU: "4"})
    )
    # the extender's watch may not have the node's devices yet: asked until it binds
    wait_for(
        lambda: bind_request("first", first.metadata.uid) == (200, {"Error": ""}),
        30,
        "first bound by the extender",
        describe=lambda: extender[0].text()[-3000:],
    )
    wait_for(lambda: "first" in bound(core, namespace), 30, "first bound")
    code, body = bind_request("first", first.metadata.uid)
    assert code == 200
    assert body["Error"] == f"pod {namespace}/first is bound to node {node} already"
    second = core.create_namespaced_pod(
        namespace, pod("second", "nobody", node_factory.selector, {GPU: "4"})
    )
    assert bind_request("second", second.metadata.uid) == (200, {"Error": ""})
    pods = bound(core, namespace)
    held = [
        {
            s.device_id
            for s in decode_assignment(
                pods[n].metadata.annotations[P.annotations.assigned_devices]
            )["main"]
        }
        for n in ("first", "second")
    ]
    assert len(held[0]) == len(held[1]) == 4
    assert not held[0] & held[1]
