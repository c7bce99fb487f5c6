"""The stock kube-scheduler places DRA claims exactly on our ResourceSlices and DeviceClasses.

A control plane of the DRA mode's release (DRA_VERSION, its parts on by default), three KWOK
nodes in DRA mode (the simulator's example inventories published as slices), the
DeviceClasses of classes.py; pods with ResourceClaimTemplates are scheduled by kube-
scheduler and run by KWOK. Every allocation is read back into Runtime shares (naming.py),
and after every test the claims of the whole cluster are checked against the sharing
invariant.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from lj_runtimekit.deviceplugin.internal.dra.classes import device_classes, profile_selector
from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY, DeviceRef, memory_step
from lj_runtimekit.deviceplugin.internal.dra.publisher import server_minor
from lj_runtimekit.deviceplugin.internal.dra.slices import build_slices, counters_apart
from lj_runtimekit.envtest import NodeFactory
from lj_runtimekit.envtest.controlplane import (
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    dra_gates,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, DeviceShare, load_protocol
from lj_runtimekit.testkit.dra import (
    RESOURCE_API,
    allocated_shares,
    claim_pod,
    claim_template,
    exactly,
    example_devices,
)
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

PROTOCOL = load_protocol()
DRIVER = PROTOCOL.dra.driver
NODES = {"dra-tdm": "tdm-8gpu", "dra-mig": "mig-8gpu", "dra-ppu": "ppu-16"}
WHOLE = PROTOCOL.dra.whole_class("gpu")
SHARE = PROTOCOL.dra.share_class("gpu")
MIG = PROTOCOL.dra.mig_class
MIG_PROFILES = sorted(
    {i.profile for d in example_devices(NODES["dra-mig"]) for i in d.mig_instances}
)
"""The profiles the MIG node's instances have: each gets a class naming its resource."""
Share = tuple[str, DeviceRef, DeviceShare]
_NAMESPACES = itertools.count(1)


class Cluster:
    """The DRA control plane's client and its nodes' inventories."""

    def __init__(self, kube: KubeClient, inventories: Mapping[str, Sequence[pb.Device]]) -> None:
        self.kube = kube
        self.inventories = inventories

    def shares(self, namespace: str | None = None) -> list[Share]:
        """Every allocated device of the claims of a namespace (default: all of them)."""
        where = f"/namespaces/{namespace}" if namespace else ""
        items, _ = self.kube.list_all(f"{RESOURCE_API}{where}/resourceclaims")
        return [
            share
            for claim in items
            if claim.get("status", {}).get("allocation")
            for share in allocated_shares(claim, DRIVER, self.inventories)
        ]


class Space:
    """One test's namespace on the cluster: templates, pods and their claims."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.kube = cluster.kube
        self.namespace = namespace

    def template(self, name: str, requests: Sequence[dict[str, Any]], **devices: Any) -> None:
        obj = claim_template(name, requests, self.namespace)
        obj["spec"]["spec"]["devices"].update(devices)
        self.kube.request(
            "POST", f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaimtemplates", obj
        )

    def pod(self, name: str, claims: Mapping[str, str], **spec: Any) -> None:
        obj = claim_pod(name, claims, namespace=self.namespace, **spec)
        self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", obj)

    def run(self, name: str, requests: Mapping[str, Sequence[dict[str, Any]]], **spec: Any) -> Any:
        """A template per pod claim, then the pod; the pod once Running."""
        for claim, reqs in requests.items():
            self.template(f"{name}-{claim}", reqs)
        self.pod(name, {c: f"{name}-{c}" for c in requests}, **spec)
        return self.running(name)

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def running(self, name: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | NotYet:
            pod = self.get(name)
            phase = pod.get("status", {}).get("phase")
            return pod if phase == "Running" else NotYet(f"{phase}: {pod.get('status')}")

        return wait_for(check, 60, f"pod {name} Running")

    def settled(self, name: str) -> dict[str, Any]:
        """The pod once Running or reported Unschedulable."""

        def check() -> dict[str, Any] | NotYet:
            pod = self.get(name)
            status = pod.get("status", {})
            if status.get("phase") == "Running" or any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in status.get("conditions") or ()
            ):
                return pod
            return NotYet(str(status))

        return wait_for(check, 60, f"pod {name} Running or Unschedulable")

    def claims_of(self, pod: Mapping[str, Any]) -> dict[str, list[Share]]:
        """Pod claim name (`<extended>` for the extended-resource claim) -> its shares, each
        checked to be on the pod's node."""
        names = {
            s["name"]: s["resourceClaimName"]
            for s in pod["status"].get("resourceClaimStatuses") or ()
        }
        extended = pod["status"].get("extendedResourceClaimStatus")
        if extended:
            names["<extended>"] = extended["resourceClaimName"]
        out: dict[str, list[Share]] = {}
        for name, claim in names.items():
            obj = self.kube.request(
                "GET", f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims/{claim}"
            )
            out[name] = allocated_shares(obj, DRIVER, self.cluster.inventories)
            assert {pool for pool, _, _ in out[name]} == {pod["spec"]["nodeName"]}, out[name]
        return out

    def clean(self) -> None:
        """Delete every pod and wait until their claims are gone (devices free again)."""
        base = f"/api/v1/namespaces/{self.namespace}/pods"
        self.kube.request("DELETE", base, query={"gracePeriodSeconds": "0"})
        wait_for(
            lambda: not self.cluster.shares(self.namespace),
            60,
            f"claims of namespace {self.namespace} deallocated",
        )


def check_sharing_invariant(shares: Sequence[Share]) -> None:
    """Per device: core and memory percentages add up to at most 100; a whole device or a
    MIG instance has one holder; no TDM share is on a device that is not in TDM mode."""
    cores: dict[tuple[str, str], int] = defaultdict(int)
    memory: dict[tuple[str, str], int] = defaultdict(int)
    holders: dict[tuple[str, str], int] = defaultdict(int)
    exclusive: set[tuple[str, str]] = set()
    for pool, ref, share in shares:
        key = (pool, ref.runtime_id)
        holders[key] += 1
        cores[key] += 100 if share.whole else share.core_percent
        memory[key] += 100 if share.whole else share.memory_percent
        if ref.instance is not None or share.whole:
            exclusive.add(key)
        else:
            assert ref.device.mode == pb.DEVICE_MODE_TDM, f"TDM share on {key}"
    for key, count in holders.items():
        assert cores[key] <= 100, (key, cores[key])
        assert memory[key] <= 100, (key, memory[key])
        assert key not in exclusive or count == 1, (key, count)


@pytest.fixture(scope="module")
def cluster(dra_k8s_tools: object) -> Iterator[Cluster]:
    """A control plane of the DRA mode's release with three KWOK nodes in DRA mode, their
    slices and our classes."""
    config = ControlPlaneConfig(version=DRA_VERSION, feature_gates=dra_gates(DRA_VERSION))
    plane = ControlPlane(config).start()
    api = plane.api_client()
    kube = KubeClient.connect(str(plane.kubeconfig_path))
    try:
        factory = NodeFactory(api, group="dra")
        for node in NODES:
            factory.create(node, gpus=0, labels={PROTOCOL.labels.device_api: DRA_MODE}, wait=False)
        factory.wait_ready(list(NODES))
        for obj in device_classes(PROTOCOL, extended_resources=True, mig_profiles=MIG_PROFILES):
            kube.request("POST", f"{RESOURCE_API}/deviceclasses", obj)
        inventories: dict[str, list[pb.Device]] = {}
        apart = counters_apart(server_minor(kube.request("GET", "/version")))
        for node, example in NODES.items():
            inventories[node] = example_devices(example, node)
            uid = kube.request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
            for obj in build_slices(
                inventories[node],
                node_name=node,
                protocol=PROTOCOL,
                generation=1,
                node_uid=uid,
                apart=apart,
            ):
                kube.request("POST", f"{RESOURCE_API}/resourceslices", obj)
        yield Cluster(kube, inventories)
    finally:
        kube.close()
        api.close()
        plane.stop()


@pytest.fixture
def space(cluster: Cluster) -> Iterator[Space]:
    """A fresh namespace; afterwards the cluster's claims are checked against the sharing
    invariant and this namespace's pods and claims are removed."""
    name = f"dra-{next(_NAMESPACES)}"
    cluster.kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    wait_for(
        lambda: any(
            sa["metadata"]["name"] == "default"
            for sa in cluster.kube.list_all(f"/api/v1/namespaces/{name}/serviceaccounts")[0]
        ),
        30,
        f"ServiceAccount default in {name}",
    )
    out = Space(cluster, name)
    yield out
    check_sharing_invariant(cluster.shares())
    out.clean()


def _memory(percent: int) -> str:
    """Bytes of `percent` % of an example GPU's memory, in the slices' 1 % steps."""
    return str(percent * memory_step(example_devices("tdm-8gpu")[0]))


def _percents(shares: Sequence[Share]) -> list[tuple[int, int]]:
    return [(s.core_percent, s.memory_percent) for _, _, s in shares]


def test_whole_gpus(space: Space) -> None:
    pod = space.run("whole", {"gpus": [exactly("g", WHOLE, count=2)]}, node="dra-tdm")
    (shares,) = space.claims_of(pod).values()
    assert len({ref.runtime_id for _, ref, _ in shares}) == 2
    for _, ref, share in shares:
        assert share == DeviceShare(ref.device.id)
        assert ref.device.kind == pb.DEVICE_KIND_GPU


def test_tdm_slices_pack_one_gpu(space: Space) -> None:
    pod = space.run(
        "slices",
        {
            "both": [exactly("s", SHARE, capacity={CORES: "30", MEMORY: _memory(25)})],
            "cores": [exactly("s", SHARE, capacity={CORES: "40", MEMORY: "0"})],
            "memory": [exactly("s", SHARE, capacity={CORES: "0", MEMORY: _memory(10)})],
            "rest": [exactly("s", SHARE, capacity={CORES: "30", MEMORY: _memory(65)})],
        },
        containers=({"main": ("both", "cores", "memory", "rest")},),
        node="dra-tdm",
    )
    claims = space.claims_of(pod)
    assert {name: _percents(shares) for name, shares in claims.items()} == {
        "both": [(30, 25)],
        "cores": [(40, 0)],
        "memory": [(0, 10)],
        "rest": [(30, 65)],
    }
    # Each slice on a TDM GPU, all four on the same one: it is full now.
    devices = {ref.device.id for shares in claims.values() for _, ref, _ in shares}
    assert len(devices) == 1
    for shares in claims.values():
        for _, ref, _ in shares:
            assert ref.device.mode == pb.DEVICE_MODE_TDM


def test_mig_instances_by_profile_beside_a_tdm_slice(space: Space) -> None:
    space.run(
        "slice",
        {"s": [exactly("s", SHARE, capacity={CORES: "50", MEMORY: _memory(50)})]},
        node="dra-mig",
    )
    pod = space.run(
        "mig",
        {
            "small": [exactly("m", MIG, count=2, selector=profile_selector(PROTOCOL, "1g.10gb"))],
            "large": [exactly("m", MIG, selector=profile_selector(PROTOCOL, "4g.40gb"))],
        },
        containers=({"main": ("small", "large")},),
    )
    claims = space.claims_of(pod)
    assert pod["spec"]["nodeName"] == "dra-mig"
    small = [ref for _, ref, _ in claims["small"]]
    (large,) = [ref for _, ref, _ in claims["large"]]
    assert [r.instance.profile if r.instance else None for r in small] == ["1g.10gb"] * 2
    assert {r.device.index for r in small} == {6}
    assert large.instance is not None
    assert large.instance.profile == "4g.40gb"
    assert large.device.index == 7
    assert all(s.whole for _, _, s in claims["small"] + claims["large"])


def test_ppus_on_one_nvlink_pair(space: Space) -> None:
    space.template(
        "pair",
        [exactly("p", PROTOCOL.dra.whole_class("ppu"), count=2)],
        constraints=[{"requests": ["p"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}],
    )
    space.pod("ppu", {"p": "pair"}, containers=({"main": ("p",)},))
    pod = space.running("ppu")
    (shares,) = space.claims_of(pod).values()
    assert pod["spec"]["nodeName"] == "dra-ppu"
    first, second = sorted(ref.device.index for _, ref, _ in shares)
    assert first % 2 == 0
    assert second == first + 1
    assert all(ref.device.kind == pb.DEVICE_KIND_PPU for _, ref, _ in shares)


def test_containers_share_one_claim_and_init_containers_have_theirs(space: Space) -> None:
    pod = space.run(
        "shared",
        {"half": [exactly("s", SHARE, capacity={CORES: "50", MEMORY: _memory(50)})]},
        containers=({"a": ("half",)}, {"b": ("half",)}),
        node="dra-tdm",
    )
    (shares,) = space.claims_of(pod).values()
    assert _percents(shares) == [(50, 50)]

    pod = space.run(
        "init",
        {
            "setup": [exactly("s", SHARE, capacity={CORES: "20", MEMORY: _memory(10)})],
            "work": [exactly("s", SHARE, capacity={CORES: "30", MEMORY: _memory(40)})],
        },
        init_containers=({"setup": ("setup",)},),
        containers=({"main": ("work",)},),
        node="dra-tdm",
    )
    claims = space.claims_of(pod)
    assert _percents(claims["setup"]) == [(20, 10)]
    assert _percents(claims["work"]) == [(30, 40)]


def test_extended_resource_without_a_claim(space: Space) -> None:
    space.pod("extended", {}, limits={PROTOCOL.resources.gpu: "1"})
    pod = space.running("extended")
    (shares,) = space.claims_of(pod).values()
    ((pool, ref, share),) = shares
    assert pool in ("dra-tdm", "dra-mig")
    assert ref.device.kind == pb.DEVICE_KIND_GPU
    assert share.whole


def test_extended_mig_profile_without_a_claim(space: Space) -> None:
    """A pod asking `<mig prefix>/mig-<profile>: 1` without a claim gets one MIG instance of
    that profile (its class names the resource); two pods never get the same instance: with
    the profile's only instance taken, the second pod stays pending."""
    small = PROTOCOL.resources.mig("1g.10gb")
    for name in ("small-a", "small-b"):
        space.pod(name, {}, limits={small: "1"})
    instances = []
    for name in ("small-a", "small-b"):
        pod = space.running(name)
        (shares,) = space.claims_of(pod).values()
        ((pool, ref, share),) = shares
        assert pool == "dra-mig"
        assert ref.instance is not None
        assert ref.instance.profile == "1g.10gb"
        assert share.whole
        instances.append(ref.runtime_id)
    assert len(set(instances)) == 2, instances

    large = PROTOCOL.resources.mig("4g.40gb")
    for name in ("large-a", "large-b"):
        space.pod(name, {}, limits={large: "1"})
    pods = [space.settled(name) for name in ("large-a", "large-b")]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(running) == 1, [p["status"] for p in pods]
    ((_, ref, _),) = next(iter(space.claims_of(running[0]).values()))
    assert ref.instance is not None
    assert ref.instance.profile == "4g.40gb"
    (pending,) = [p for p in pods if p not in running]
    (condition,) = [c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["reason"] == "Unschedulable"


def test_a_pod_that_cannot_fit_stays_pending(space: Space) -> None:
    space.template("many", [exactly("g", WHOLE, count=15)])
    space.pod("many", {"g": "many"}, containers=({"main": ("g",)},))
    pod = space.settled("many")
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in condition["message"]
    assert "nodeName" not in pod["spec"]


def test_bursts_fill_mig_instances_and_ppu_pairs_exactly(space: Space) -> None:
    profiles = ["1g.10gb"] * 8 + ["3g.40gb", "4g.40gb"]
    for n, profile in enumerate(profiles):
        space.template(
            f"mig-{n}", [exactly("m", MIG, selector=profile_selector(PROTOCOL, profile))]
        )
    pair = {"constraints": [{"requests": ["p"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}]}
    space.template("pair", [exactly("p", PROTOCOL.dra.whole_class("ppu"), count=2)], **pair)
    for n in range(len(profiles)):
        space.pod(f"mig-{n}", {"m": f"mig-{n}"}, containers=({"main": ("m",)},))
    for n in range(9):
        space.pod(f"ppu-{n}", {"p": "pair"}, containers=({"main": ("p",)},))
    pods = [space.settled(f"mig-{n}") for n in range(len(profiles))]
    pods += [space.settled(f"ppu-{n}") for n in range(9)]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    pending = sorted(p["metadata"]["name"] for p in pods if p not in running)
    # Seven 1g.10gb instances for eight pods; eight PPU pairs for nine.
    assert len(pending) == 2
    assert pending[0].startswith("mig-")
    assert pending[1].startswith("ppu-")
    used = [ref for p in running for shares in space.claims_of(p).values() for _, ref, _ in shares]
    mig = sorted(r.runtime_id for r in used if r.instance is not None)
    everything = space.cluster.inventories["dra-mig"]
    assert mig == sorted(i.id for d in everything for i in d.mig_instances)
    ppus = sorted(r.runtime_id for r in used if r.device.kind == pb.DEVICE_KIND_PPU)
    assert ppus == sorted(d.id for d in space.cluster.inventories["dra-ppu"])


def test_two_pods_with_a_whole_gpu_each_share_a_node(space: Space) -> None:
    space.run("first", {"g": [exactly("g", WHOLE)]}, node="dra-tdm")
    space.template("g", [exactly("g", WHOLE)])
    space.pod("second", {"g": "g"}, containers=({"main": ("g",)},), node="dra-tdm")
    assert space.settled("second")["status"].get("phase") == "Running"


def test_a_slice_that_does_not_fit_the_first_gpu_goes_to_another(space: Space) -> None:
    space.run(
        "first",
        {"s": [exactly("s", SHARE, capacity={CORES: "60", MEMORY: _memory(60)})]},
        node="dra-tdm",
    )
    space.template("s", [exactly("s", SHARE, capacity={CORES: "60", MEMORY: _memory(60)})])
    space.pod("second", {"s": "s"}, containers=({"main": ("s",)},), node="dra-tdm")
    assert space.settled("second")["status"].get("phase") == "Running"
