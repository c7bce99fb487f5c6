"""DRA mode end to end on the real kubelet code with the real plugin.

A control plane with the alpha DRA gates and kube-scheduler; two hollow nodes (the
kubelet's own DRA manager) with a Runtime simulator each (the tdm-8gpu and mig-8gpu
example inventories) and one `lj-dra-plugin` process per node, pointed at that node's
kubelet directory, Runtime socket and a CDI directory. Pods with claims run on the real
kubelet; what the kubelet gave each container, what the Runtime holds and what the
PodResources API reports are checked against the claims' allocations, across restarts of
the plugin, the kubelet and the Runtime, a failed prepare and a churn of pods.

kube-scheduler 1.34.4 re-checks a request's capacity against the first GPU of a node's
slice: once that GPU is taken whole or mostly shared, a request that would fit another
GPU is refused. So TDM slices stay small and on the tdm node's first GPU, the one whole
GPU goes to the mig node (the first of its TDM GPUs) and the mig node otherwise serves
MIG instances.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit.deviceplugin.internal.dra.cdi import CdiSpecs
from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes, profile_selector
from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY, DeviceRef, memory_step
from lj_runtimekit.deviceplugin.internal.dra.prepare import container_key
from lj_runtimekit.deviceplugin.internal.dra.server import registration_socket
from lj_runtimekit.envtest.controlplane import (
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    dra_gates,
)
from lj_runtimekit.envtest.hollownode import HollowNode
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2_grpc as prgrpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, DeviceShare, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeClient
from lj_runtimekit.proto.pkg.runtimeclient.shares import from_request
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET
from lj_runtimekit.testkit.dra import (
    RESOURCE_API,
    allocated_shares,
    claim_pod,
    claim_template,
    exactly,
)
from lj_runtimekit.testkit.invariant import Holding, sharing_violations
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

PROTOCOL = load_protocol()
DRIVER = PROTOCOL.dra.driver
WHOLE = PROTOCOL.dra.whole_class("gpu")
SHARE = PROTOCOL.dra.share_class("gpu")
MIG = PROTOCOL.dra.mig_class
TDM, MIGN = "dra-tdm", "dra-mig"
NODES = {TDM: ("tdm-8gpu", "127.0.0.2"), MIGN: ("mig-8gpu", "127.0.0.3")}
NS = "dra-e2e"
SLICES = f"{RESOURCE_API}/resourceslices"
EXIT_AT_ONCE = "/bin/true"
"""A container with this command runs as a local process on the hollow node and ends."""
_NAMES = itertools.count(1)


@dataclass
class NodeBed:
    """One hollow node, its Runtime simulator and its plugin process."""

    node: HollowNode
    example: str
    workdir: Path
    kubeconfig: Path
    sim: SimulatorProcess | None = None
    plugin: subprocess.Popen[bytes] | None = None
    inventory: list[pb.Device] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def socket_dir(self) -> Path:
        return self.workdir / "rt"

    @property
    def cdi(self) -> CdiSpecs:
        return CdiSpecs(self.workdir / "cdi", DRIVER)

    @property
    def plugin_log(self) -> Path:
        return self.workdir / "plugin.log"

    def start_sim(self) -> None:
        """A fresh simulator on the node's socket directory (state of its own: none)."""
        self.sim = SimulatorProcess(self.socket_dir, EXAMPLE_NODES / f"{self.example}.yaml")
        self.sim.start()
        self.inventory = self.runtime(lambda rt: rt.list_devices())

    def start_plugin(self) -> None:
        """`lj-dra-plugin` for this node; returns once its registration socket is there."""
        argv = [
            sys.executable,
            "-m",
            "lj_runtimekit.deviceplugin.cmd.dra_plugin.main",
            "--log-format=text",
            f"--node-name={self.name}",
            f"--kubeconfig={self.kubeconfig}",
            f"--runtime-socket={self.socket_dir / RUNTIME_SOCKET}",
            f"--kubelet-dir={self.node.root_dir}",
            f"--cdi-dir={self.workdir / 'cdi'}",
        ]
        with self.plugin_log.open("ab") as log:
            self.plugin = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(
            lambda: registration_socket(self.node.root_dir, DRIVER).exists(),
            30,
            f"the plugin of {self.name} serving",
            describe=self.log,
        )

    def stop_plugin(self, sig: int = signal.SIGTERM) -> None:
        if self.plugin is not None and self.plugin.poll() is None:
            self.plugin.send_signal(sig)
            self.plugin.wait(30)
        self.plugin = None

    def log(self) -> str:
        return self.plugin_log.read_text(errors="replace") if self.plugin_log.exists() else ""

    def runtime(self, call: Any) -> Any:
        """`call(RuntimeClient)` awaited on a client of this node's Runtime."""

        async def run() -> Any:
            async with RuntimeClient(self.socket_dir, RUNTIME_SOCKET) as rt:
                return await call(rt)

        return asyncio.run(run())

    def claim_allocations(self) -> dict[str, list[pb.Allocation]]:
        """The Runtime's claim allocations by claim UID (a list: one expected)."""
        out: dict[str, list[pb.Allocation]] = {}
        for a in self.runtime(lambda rt: rt.list_allocations()):
            if a.claim_uid:
                assert a.container_key == container_key(a.claim_uid), a
                out.setdefault(a.claim_uid, []).append(a)
        return out

    def pod_resources(self) -> list[Any]:
        with grpc.insecure_channel(f"unix://{self.node.pod_resources_socket}") as channel:
            stub = prgrpc.PodResourcesListerStub(channel)
            listed = stub.List(prpb.ListPodResourcesRequest(), timeout=10)
        return [p for p in listed.pod_resources if p.namespace == NS]


class Bed:
    """The control plane, the two nodes and the test namespace."""

    def __init__(self, kube: KubeClient, nodes: Mapping[str, NodeBed]) -> None:
        self.kube = kube
        self.nodes = nodes

    # -- objects ----------------------------------------------------------------------------

    def template(self, name: str, requests: Sequence[dict[str, Any]]) -> None:
        path = f"{RESOURCE_API}/namespaces/{NS}/resourceclaimtemplates"
        self.kube.request("POST", path, claim_template(name, requests, NS))

    def pod(self, name: str, claims: Mapping[str, str], node: str, **spec: Any) -> None:
        """A pod pinned to `node` (testkit.dra.claim_pod); its init containers run
        EXIT_AT_ONCE, so they end."""
        obj = claim_pod(name, claims, namespace=NS, node=node, **spec)
        for container in obj["spec"].get("initContainers", ()):
            container["command"] = [EXIT_AT_ONCE]
        self.kube.request("POST", f"/api/v1/namespaces/{NS}/pods", obj)

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}")

    def pods(self) -> list[dict[str, Any]]:
        return self.kube.list_all(f"/api/v1/namespaces/{NS}/pods")[0]

    def events(self, name: str) -> list[tuple[str, str]]:
        items, _ = self.kube.list_all(
            f"/api/v1/namespaces/{NS}/events", {"fieldSelector": f"involvedObject.name={name}"}
        )
        return [(e.get("reason", ""), e.get("message", "")) for e in items]

    def running(self, *names: str, timeout_s: float = 90) -> list[dict[str, Any]]:
        def check(name: str) -> dict[str, Any] | NotYet:
            pod = self.get(name)
            phase = pod.get("status", {}).get("phase")
            return pod if phase == "Running" else NotYet(f"{phase}: {self.events(name)}")

        return [wait_for(functools.partial(check, n), timeout_s, f"pod {n} Running") for n in names]

    def claims(self) -> list[dict[str, Any]]:
        return self.kube.list_all(f"{RESOURCE_API}/namespaces/{NS}/resourceclaims")[0]

    def claim_of(self, pod: Mapping[str, Any], claim: str) -> dict[str, Any]:
        (name,) = [
            s["resourceClaimName"]
            for s in pod["status"]["resourceClaimStatuses"]
            if s["name"] == claim
        ]
        return self.kube.request("GET", f"{RESOURCE_API}/namespaces/{NS}/resourceclaims/{name}")

    def shares(self, claim: Mapping[str, Any]) -> list[DeviceShare]:
        inventories = {n: b.inventory for n, b in self.nodes.items()}
        return [s for _, _, s in allocated_shares(claim, DRIVER, inventories)]

    def slices(self, node: str) -> list[dict[str, Any]]:
        return self.kube.list_all(SLICES, {"fieldSelector": f"spec.nodeName={node}"})[0]

    def delete_pods(self) -> None:
        """Delete every pod of the namespace; wait until they and their claims are gone and
        no Runtime holds a claim (NodeUnprepareResources released them)."""
        self.kube.request(
            "DELETE", f"/api/v1/namespaces/{NS}/pods", query={"gracePeriodSeconds": "0"}
        )

        def clean() -> bool | NotYet:
            pods = [p["metadata"]["name"] for p in self.pods()]
            claims = [c["metadata"]["name"] for c in self.claims()]
            held = {n: list(b.claim_allocations()) for n, b in self.nodes.items()}
            if pods or claims or any(held.values()):
                return NotYet(f"pods {pods}, claims {claims}, Runtime claims {held}")
            return True

        wait_for(clean, 90, "pods, claims and the Runtimes' claim allocations gone")
        for bed in self.nodes.values():
            assert bed.cdi.claim_uids() == set(), f"CDI specs left on {bed.name}"


def check_invariant(bed: Bed) -> list[str]:
    """Claims, the Runtimes' claim allocations and PodResources agree and share no device
    twice; the violations (empty when the invariant holds). Call with no pod starting or
    ending."""
    claims = {c["metadata"]["uid"]: c for c in bed.claims()}
    allocated: list[Holding] = []
    for uid, claim in claims.items():
        if claim.get("status", {}).get("allocation"):
            inventories = {n: b.inventory for n, b in bed.nodes.items()}
            allocated += [(p, uid, s) for p, _, s in allocated_shares(claim, DRIVER, inventories)]
    problems = sharing_violations("claims", allocated)
    held: list[Holding] = []
    held_uids: dict[str, set[str]] = {}
    for name, node in bed.nodes.items():
        allocations = node.claim_allocations()
        held_uids[name] = set(allocations)
        for uid, entries in allocations.items():
            if len(entries) != 1:
                problems.append(f"runtime: claim {uid} held {len(entries)} times on {name}")
            if uid not in claims:
                problems.append(f"runtime: claim {uid} on {name} has no live claim")
            held += [(name, uid, from_request(d)) for a in entries for d in a.devices]
    problems += sharing_violations("runtime", held)
    expected = sorted((n, u, s) for n, u, s in allocated if u in held_uids.get(n, set()))
    if sorted(held) != expected:
        problems.append(f"runtime shares {sorted(held)} are not the claims' {expected}")
    for pod in bed.pods():
        if pod.get("status", {}).get("phase") != "Running":
            continue
        node = pod["spec"]["nodeName"]
        names = {s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses", ())}
        # PodResources reports the claims of the regular containers.
        regular = {
            c["name"] for k in pod["spec"]["containers"] for c in k["resources"].get("claims", ())
        }
        in_use = {
            s["resourceClaimName"]
            for s in pod["status"].get("resourceClaimStatuses", ())
            if s["name"] in regular
        }
        uids = {u for u, c in claims.items() if c["metadata"]["name"] in names}
        missing = uids - held_uids[node]
        if missing:
            problems.append(f"pod {pod['metadata']['name']}: claims {missing} not held on {node}")
        reported = {
            d.claim_name
            for p in bed.nodes[node].pod_resources()
            if p.name == pod["metadata"]["name"]
            for c in p.containers
            for d in c.dynamic_resources
        }
        if reported != in_use:
            problems.append(f"pod {pod['metadata']['name']}: PodResources {reported} != {in_use}")
    return problems


@pytest.fixture(scope="module")
def bed(dra_k8s_tools: object) -> Iterator[Bed]:
    """The control plane, two hollow nodes in DRA mode with a simulator and a plugin each,
    our DeviceClasses and the namespace."""
    plane = ControlPlane(
        ControlPlaneConfig(version=DRA_VERSION, feature_gates=dra_gates(DRA_VERSION), kwok=False)
    ).start()
    kube = KubeClient.connect(str(plane.kubeconfig_path))
    nodes: dict[str, NodeBed] = {}
    try:
        for obj in device_classes(PROTOCOL, extended_resources=False):
            kube.request("POST", f"{RESOURCE_API}/deviceclasses", obj)
        kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        for name, (example, address) in NODES.items():
            node = HollowNode(
                plane,
                name,
                address=address,
                labels={PROTOCOL.labels.device_api: DRA_MODE},
                exec_command_prefix=EXIT_AT_ONCE,
            )
            nodes[name] = NodeBed(
                node, example, plane.state_dir / "dra" / name, plane.kubeconfig_path
            )
            node.start()
            node.wait_resource_slices_wiped()
            nodes[name].start_sim()
            nodes[name].start_plugin()
        bed = Bed(kube, nodes)
        for name in nodes:
            wait_for(functools.partial(bed.slices, name), 30, f"slices of {name}")
        wait_for(
            lambda: kube.list_all(f"/api/v1/namespaces/{NS}/serviceaccounts")[0],
            30,
            f"ServiceAccount default in {NS}",
        )
        yield bed
    finally:
        for each in nodes.values():
            each.stop_plugin()
            if each.sim is not None:
                each.sim.stop()
            each.node.stop(delete_node=True)
        kube.close()
        plane.stop()


@pytest.fixture
def space(bed: Bed) -> Iterator[Bed]:
    """The bed; afterwards every pod of the namespace is deleted and nothing may leak."""
    yield bed
    bed.delete_pods()


def _memory(bed: Bed, percent: int) -> str:
    return str(percent * memory_step(bed.nodes[TDM].inventory[0]))


def slice_request(bed: Bed, cores: int, memory: int) -> list[dict[str, Any]]:
    return [exactly("s", SHARE, capacity={CORES: str(cores), MEMORY: _memory(bed, memory)})]


def mig_request() -> list[dict[str, Any]]:
    return [exactly("m", MIG, selector=profile_selector(PROTOCOL, "1g.10gb"))]


def check_pod(bed: Bed, pod: Mapping[str, Any], uses: Mapping[str, Sequence[str]]) -> None:
    """Each container (`uses`: container -> pod claim names) got exactly the CDI IDs the
    plugin returned for its claims; each claim's CDI spec carries the Runtime's injection;
    the Runtime holds each claim once with the allocation's shares; PodResources names the
    claims and devices of the regular containers."""
    node = bed.nodes[pod["spec"]["nodeName"]]
    uid = pod["metadata"]["uid"]
    claims = {c: bed.claim_of(pod, c) for cs in uses.values() for c in cs}
    held = node.claim_allocations()
    for name, claim in claims.items():
        cuid = claim["metadata"]["uid"]
        shares = bed.shares(claim)
        assert [[from_request(d) for d in a.devices] for a in held.get(cuid, [])] == [shares]
        spec = json.loads(node.cdi.path(cuid).read_text())
        (device,) = spec["devices"]
        env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
        assert env["LJ_VISIBLE_DEVICES"] == ",".join(s.device_id for s in shares), (name, env)
    reported = {p.name: p for p in node.pod_resources()}[pod["metadata"]["name"]]
    init = {c["name"] for c in pod["spec"].get("initContainers", ())}
    # PodResources lists a pod's (regular) containers, not its init containers.
    assert {c.name for c in reported.containers} == set(uses) - init
    for container, used in uses.items():
        ids = [node.cdi.device_id(claims[c]["metadata"]["uid"]) for c in used]
        assert node.node.container_cdi_devices(uid, container) == ids, container
        if container in init:
            continue
        (entry,) = [c for c in reported.containers if c.name == container]
        got = {
            d.claim_name: [(r.driver_name, r.pool_name, r.device_name) for r in d.claim_resources]
            for d in entry.dynamic_resources
        }
        want = {
            claims[c]["metadata"]["name"]: [
                (r["driver"], r["pool"], r["device"])
                for r in claims[c]["status"]["allocation"]["devices"]["results"]
            ]
            for c in used
        }
        assert got == want, container
        cdi = {
            d.claim_name: [i.name for r in d.claim_resources for i in r.cdi_devices]
            for d in entry.dynamic_resources
        }
        assert cdi == {
            claims[c]["metadata"]["name"]: [node.cdi.device_id(claims[c]["metadata"]["uid"])]
            for c in used
        }


def test_claims_run_on_the_real_kubelet(space: Bed) -> None:
    bed = space
    bed.template("whole", [exactly("g", WHOLE)])
    bed.template("slice", slice_request(bed, 20, 20))
    bed.template("mig", mig_request())
    bed.template("half", slice_request(bed, 20, 20))
    bed.template("setup", slice_request(bed, 10, 10))
    bed.template("work", slice_request(bed, 10, 10))
    bed.pod("whole", {"g": "whole"}, MIGN, containers=({"main": ("g",)},))
    bed.pod("slice", {"s": "slice"}, TDM, containers=({"main": ("s",)},))
    bed.pod("mig", {"m": "mig"}, MIGN, containers=({"main": ("m",)},))
    bed.pod("shared", {"h": "half"}, TDM, containers=({"a": ("h",)}, {"b": ("h",)}))
    bed.pod(
        "init",
        {"setup": "setup", "work": "work"},
        TDM,
        init_containers=({"prep": ("setup",)},),
        containers=({"main": ("work",)},),
    )
    uses: dict[str, dict[str, Sequence[str]]] = {
        "whole": {"main": ("g",)},
        "slice": {"main": ("s",)},
        "mig": {"main": ("m",)},
        "shared": {"a": ("h",), "b": ("h",)},
        "init": {"prep": ("setup",), "main": ("work",)},
    }
    pods = dict(zip(uses, bed.running(*uses), strict=True))
    for name, pod in pods.items():
        check_pod(bed, pod, uses[name])
    inventories = {n: b.inventory for n, b in bed.nodes.items()}

    def allocated(pod: str, claim: str) -> tuple[DeviceRef, DeviceShare]:
        ((_, ref, share),) = allocated_shares(bed.claim_of(pods[pod], claim), DRIVER, inventories)
        return ref, share

    ref, share = allocated("whole", "g")
    assert share == DeviceShare(ref.device.id)
    assert ref.instance is None
    ref, share = allocated("mig", "m")
    assert ref.instance is not None
    assert ref.instance.profile == "1g.10gb"
    assert share == DeviceShare(ref.instance.id)
    for name, claim, percent in (("slice", "s", 20), ("shared", "h", 20), ("init", "work", 10)):
        ref, share = allocated(name, claim)
        assert (share.core_percent, share.memory_percent) == (percent, percent), name
        assert ref.device.mode == pb.DEVICE_MODE_TDM
    assert check_invariant(bed) == []
    bed.delete_pods()
    assert check_invariant(bed) == []


def test_device_health_reaches_the_pod_status(space: Bed) -> None:
    """The kubelet's DRA health stream: a device the Runtime reports unhealthy shows in the
    status of the pod that holds it, with the Runtime's reason, and heals."""
    bed = space
    bed.template("sick", slice_request(bed, 10, 10))
    bed.pod("sick", {"c": "sick"}, TDM, containers=({"main": ("c",)},))
    (pod,) = bed.running("sick")
    inventories = {n: b.inventory for n, b in bed.nodes.items()}
    ((_, ref, _),) = allocated_shares(bed.claim_of(pod, "c"), DRIVER, inventories)
    sim = bed.nodes[TDM].sim
    assert sim is not None

    def health() -> list[dict[str, Any]]:
        (status,) = bed.get("sick")["status"]["containerStatuses"]
        return [r for a in status.get("allocatedResourcesStatus") or () for r in a["resources"]]

    def shows(want: str) -> list[dict[str, Any]] | NotYet:
        now = health()
        return now if [r.get("health") for r in now] == [want] else NotYet(str(now))

    assert wait_for(lambda: shows("Healthy"), 60, "the claim's device Healthy in the pod")
    sim.set_health(ref.device.id, False, "XID 79")
    (sick,) = wait_for(lambda: shows("Unhealthy"), 60, "the device Unhealthy in the pod")
    claim_uid = bed.claim_of(pod, "c")["metadata"]["uid"]
    assert sick["resourceID"] == bed.nodes[TDM].cdi.device_id(claim_uid)  # the claim's CDI ID
    assert sick.get("message") == "XID 79"
    sim.set_health(ref.device.id, True)
    wait_for(lambda: shows("Healthy"), 60, "the device Healthy again in the pod")


def start_pods(bed: Bed, prefix: str, tdm: int, mig: int) -> list[str]:
    """`tdm` pods with a 10 % slice on the tdm node, `mig` pods with a 1g.10gb instance on
    the mig node; their names."""
    names = []
    for _ in range(tdm):
        name = f"{prefix}-{next(_NAMES)}"
        bed.template(name, slice_request(bed, 10, 10))
        bed.pod(name, {"c": name}, TDM, containers=({"main": ("c",)},))
        names.append(name)
    for _ in range(mig):
        name = f"{prefix}-{next(_NAMES)}"
        bed.template(name, mig_request())
        bed.pod(name, {"c": name}, MIGN, containers=({"main": ("c",)},))
        names.append(name)
    return names


def check_new_pod(bed: Bed, prefix: str) -> None:
    """A new pod on each node still gets prepared and runs."""
    names = start_pods(bed, prefix, 1, 1)
    for pod in bed.running(*names):
        check_pod(bed, pod, {"main": ("c",)})


def held_claims(bed: Bed) -> dict[str, set[str]]:
    """The claim UIDs each node's Runtime holds."""
    return {n: set(b.claim_allocations()) for n, b in bed.nodes.items()}


def restart_runtimes(bed: Bed) -> None:
    """Every node's simulator stopped and started afresh (it keeps no allocations)."""
    for node in bed.nodes.values():
        assert node.sim is not None
        node.sim.stop()
        node.start_sim()


def test_plugin_restart_keeps_one_allocation_per_claim(space: Bed) -> None:
    bed = space
    bed.running(*start_pods(bed, "keep", 2, 2))
    before = held_claims(bed)
    assert sum(len(u) for u in before.values()) == 4
    slices = {n: bed.slices(n) for n in bed.nodes}
    for node in bed.nodes.values():
        node.stop_plugin(signal.SIGKILL)
        assert bed.slices(node.name) == slices[node.name], "slices stay while the plugin is away"
        node.start_plugin()
    for name in bed.nodes:
        wait_for(functools.partial(bed.slices, name), 30, f"slices of {name}")
    # The checkpoint read back: the same claims held, none twice.
    assert held_claims(bed) == before
    assert check_invariant(bed) == []
    check_new_pod(bed, "after-plugin")
    assert check_invariant(bed) == []


def test_plugin_start_after_a_runtime_restart_holds_the_claims_again(space: Bed) -> None:
    bed = space
    bed.running(*start_pods(bed, "lost", 2, 2))
    before = held_claims(bed)
    for node in bed.nodes.values():  # stopped: a running plugin gives the claims back itself
        node.stop_plugin()
    restart_runtimes(bed)
    assert held_claims(bed) == {n: set() for n in bed.nodes}
    for node in bed.nodes.values():
        node.start_plugin()  # its start reconciles the checkpoint with the Runtime
    assert held_claims(bed) == before
    assert check_invariant(bed) == []
    check_new_pod(bed, "after-runtime")
    assert check_invariant(bed) == []


def test_runtime_restart_is_reconciled_by_the_running_plugin(space: Bed) -> None:
    bed = space
    bed.running(*start_pods(bed, "rt", 1, 1))
    before = held_claims(bed)
    restart_runtimes(bed)
    try:
        wait_for(
            lambda: held_claims(bed) == before or NotYet(str(held_claims(bed))),
            20,
            "the running plugins to allocate their claims again in the restarted Runtimes",
        )
        assert check_invariant(bed) == []
    finally:
        if held_claims(bed) != before:
            for node in bed.nodes.values():  # a start reconciles: leave the bed usable
                node.stop_plugin()
                node.start_plugin()


def restart_kubelet(bed: Bed, pod: Mapping[str, Any]) -> None:
    """Restarts the pod's hollow node (a kubelet whose fake runtime starts empty, as after a
    node reboot) and waits until it has wiped the node's slices and created the pod's
    container main again: after a second NodePrepareResources of its claim."""
    node = bed.nodes[pod["spec"]["nodeName"]]
    uid = pod["metadata"]["uid"]
    (node.node.cdi_devices_dir / f"{uid}_main.json").unlink()
    node.node.restart()
    node.node.wait_resource_slices_wiped()
    wait_for(
        lambda: node.node.container_cdi_devices(uid, "main"),
        60,
        f"container main of {pod['metadata']['name']} created again",
    )


def restore_slices(bed: Bed, name: str) -> None:
    """If the node's slices are missing, restart its plugin (a start publishes them)."""
    if not bed.slices(name):
        bed.nodes[name].stop_plugin()
        bed.nodes[name].start_plugin()
        wait_for(lambda: bed.slices(name), 30, f"slices of {name}")


def test_kubelet_restart_prepares_again_without_a_second_allocation(space: Bed) -> None:
    bed = space
    names = start_pods(bed, "kubelet", 1, 1)
    pods = bed.running(*names)
    before = held_claims(bed)
    pod = next(p for p in pods if p["spec"]["nodeName"] == TDM)
    restart_kubelet(bed, pod)
    # The repeated prepare is answered from the plugin's checkpoint: the same claim held once.
    assert held_claims(bed) == before
    (running,) = bed.running(pod["metadata"]["name"])
    assert running["metadata"]["uid"] == pod["metadata"]["uid"]
    claim = bed.claim_of(pod, "c")
    cdi = bed.nodes[TDM].node.container_cdi_devices(pod["metadata"]["uid"], "main")
    # The kubelet of the DRA pin replaces a claim's devices with the repeated answer: the
    # claim's CDI device once, not twice.
    assert cdi == [bed.nodes[TDM].cdi.device_id(claim["metadata"]["uid"])]
    assert check_invariant(bed) == []
    restore_slices(bed, TDM)
    check_new_pod(bed, "after-kubelet")
    assert check_invariant(bed) == []


def test_slices_are_published_again_after_a_kubelet_restart(space: Bed) -> None:
    bed = space
    (pod,) = bed.running(*start_pods(bed, "wiped", 1, 0))
    restart_kubelet(bed, pod)
    try:
        wait_for(
            lambda: bed.slices(TDM),
            20,
            f"the plugin to publish the slices of {TDM} again after the kubelet wiped them",
        )
    finally:
        restore_slices(bed, TDM)


def test_failed_prepare_keeps_the_pod_from_starting(space: Bed) -> None:
    bed = space
    bed.template("nothing", slice_request(bed, 0, 0))
    bed.pod("nothing", {"c": "nothing"}, TDM, containers=({"main": ("c",)},))

    def failed() -> list[str]:
        return [m for r, m in bed.events("nothing") if r == "FailedPrepareDynamicResources"]

    (message, *_) = wait_for(failed, 60, "FailedPrepareDynamicResources on pod nothing")
    assert "a slice of 0 cores and 0 memory is no share" in message, message
    pod = bed.get("nothing")
    assert pod["status"]["phase"] == "Pending"
    node = bed.nodes[TDM]
    assert node.node.container_cdi_devices(pod["metadata"]["uid"], "main") is None
    claim = bed.claim_of(pod, "c")
    assert claim["metadata"]["uid"] not in node.claim_allocations()
    assert not node.cdi.path(claim["metadata"]["uid"]).exists()
    # The kubelet unprepares the claim it checkpointed before the failed prepare.
    bed.delete_pods()
    assert check_invariant(bed) == []


def test_churn_with_a_plugin_restart(space: Bed) -> None:
    bed = space
    created = 0
    conflicts: list[str] = []
    for wave in range(4):
        names = start_pods(bed, f"churn{wave}", 5, 5)
        created += len(names)
        if wave == 2:
            bed.nodes[TDM].stop_plugin(signal.SIGKILL)
            bed.nodes[TDM].start_plugin()
        bed.running(*names)
        conflicts += check_invariant(bed)
        bed.delete_pods()
        conflicts += check_invariant(bed)
    print(f"churn: {created} pods, {len(conflicts)} conflicts")
    assert created == 40
    assert conflicts == []
