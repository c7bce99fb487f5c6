"""NodePrepareResources/NodeUnprepareResources against the Runtime simulator (in process, on a
unix socket) and claims on the real API server with the DRA gates: claims and their
status.allocation are written as the scheduler would (status subresource).

The promise attacked: one Runtime allocation per claim whatever repeats it, a refusal
leaves nothing held and no CDI spec, and restarts (plugin, Runtime) neither prepare twice
nor leak."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit.deviceplugin.internal.dra.cdi import CdiSpecs
from lj_runtimekit.deviceplugin.internal.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
)
from lj_runtimekit.deviceplugin.internal.dra.claims import ClaimDevice, ClaimRef, claim_path
from lj_runtimekit.deviceplugin.internal.dra.prepare import Preparer, container_key
from lj_runtimekit.envtest import DRA_VERSION, ControlPlane, ControlPlaneConfig, dra_gates
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import MERGE_PATCH, KubeClient
from lj_runtimekit.proto.pkg.protocol import DeviceShare, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET, Simulator
from lj_runtimekit.testkit.kubeconfig import unreachable_kubeconfig

pytestmark = pytest.mark.controlplane

DRIVER = load_protocol().dra.driver
POOL = "node-a"
GIB = 1024**3


def start_control_plane() -> Iterator[ControlPlane]:
    """etcd and kube-apiserver with the DRA gates (claims need nothing else)."""
    config = ControlPlaneConfig(
        controller_manager=False,
        scheduler=False,
        kwok=False,
        version=DRA_VERSION,
        feature_gates=dra_gates(DRA_VERSION),
    )
    with ControlPlane(config) as cp:
        yield cp


@pytest.fixture(scope="module")
def dra_cp(dra_k8s_tools: Any) -> Iterator[ControlPlane]:
    """The module's control plane."""
    yield from start_control_plane()


@pytest.fixture(scope="module")
def kube(dra_cp: ControlPlane) -> Iterator[KubeClient]:
    """An admin client of the module's control plane."""
    client = KubeClient.connect(str(dra_cp.kubeconfig_path))
    yield client
    client.close()


@pytest.fixture
def ns(kube: KubeClient, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for the test's claims."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name


def result(
    device: str,
    request: str = "gpu",
    *,
    pool: str = POOL,
    driver: str = DRIVER,
    consumed: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One allocation result as the scheduler writes it (a share gets its own share ID)."""
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed is not None:
        out["consumedCapacity"] = dict(consumed)
        out["shareID"] = str(uuid.uuid4())
    return out


def write_claim(
    kube: KubeClient,
    namespace: str,
    name: str,
    results: Sequence[Mapping[str, Any]] | None,
    requests: Sequence[str] = ("gpu",),
) -> ClaimRef:
    """Create a claim and, unless `results` is None, allocate it (status subresource)."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": f"gpu.{DRIVER}"}} for r in requests
                ]
            }
        },
    }
    claim = kube.request(
        "POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", body=body
    )
    if results is not None:
        claim["status"] = {"allocation": {"devices": {"results": list(results)}}}
        claim = kube.request("PUT", claim_path(namespace, name) + "/status", body=claim)
        got = claim["status"]["allocation"]["devices"]["results"]
        assert [r.get("consumedCapacity") for r in got] == [
            r.get("consumedCapacity") for r in results
        ], "the API server dropped consumedCapacity: DRAConsumableCapacity is off"
    return ClaimRef(namespace, name, claim["metadata"]["uid"])


@dataclass
class Node:
    """The plugin's parts on one node: the simulator, the Runtime client, the CDI and
    state directories; `preparer()` starts a plugin over them (again after a restart)."""

    sim: Simulator
    runtime: RuntimeClient
    kube: KubeClient
    cdi_dir: Path
    state_dir: Path

    def preparer(
        self,
        cdi_dir: Path | None = None,
        state_dir: Path | None = None,
        inventory: Callable[[], Sequence[pb.Device] | None] | None = None,
    ) -> Preparer:
        """A fresh plugin's preparer over the same directories (unless others are given)."""
        return Preparer(
            self.kube,
            self.runtime,
            DRIVER,
            POOL,
            CdiSpecs(cdi_dir or self.cdi_dir, DRIVER),
            Checkpoint(state_dir or self.state_dir),
            inventory=inventory,
        )

    def gpu(self, index: int) -> str:
        """The Runtime ID of GPU `index`."""
        return self.sim.state.devices[index].id

    def held(self) -> dict[str, tuple[pb.DeviceRequest, ...]]:
        """The simulator's allocations by container key."""
        return {
            a.request.container_key: tuple(
                pb.DeviceRequest(
                    device_id=g.device_id,
                    core_percent=g.core_percent,
                    memory_percent=g.memory_percent,
                )
                for g in a.request.grants
            )
            for a in self.sim.allocator.allocations()
        }

    def specs(self) -> list[str]:
        """The CDI spec files present."""
        return sorted(p.name for p in self.cdi_dir.glob("*.json")) if self.cdi_dir.is_dir() else []

    async def restart_runtime(self) -> None:
        """A Runtime that comes back with no allocations (same socket)."""
        await self.sim.stop(0)
        self.sim = Simulator(self.sim.node, self.sim.socket_dir)
        await self.sim.start()


class CountingRuntime(RuntimeClient):
    """The Runtime client, counting its ListDevices calls."""

    list_calls = 0

    async def list_devices(self) -> list[pb.Device]:
        self.list_calls += 1
        return await super().list_devices()


@pytest.fixture
async def node(workdir: Path, kube: KubeClient) -> AsyncIterator[Node]:
    """A TDM node with 8 GPUs of 80 GiB."""
    sim = Simulator(load_node_file(EXAMPLE_NODES / "tdm-8gpu.yaml"), workdir / "sim")
    await sim.start()
    runtime = CountingRuntime(
        workdir / "sim", RUNTIME_SOCKET, RetryPolicy(attempts=5, max_delay_s=5)
    )
    n = Node(sim, runtime, kube, workdir / "cdi", workdir / "state")
    try:
        yield n
    finally:
        await runtime.close()
        await n.sim.stop(0)


async def prepared(preparer: Preparer, *refs: ClaimRef) -> list[PreparedClaim]:
    """Prepare claims that must succeed."""
    outcomes = await preparer.prepare(refs)
    out: list[PreparedClaim] = []
    for ref in refs:
        outcome = outcomes[ref.uid]
        assert not isinstance(outcome, str), outcome
        out.append(outcome)
    return out


async def test_prepare_allocates_the_claim_once_with_a_cdi_spec(node: Node, ns: str) -> None:
    ref = write_claim(
        node.kube,
        ns,
        "train",
        [
            result("gpu-0", "whole"),
            result("gpu-1", "share", consumed={"cores": "30", "memory": f"{20 * GIB}"}),
        ],
        requests=("whole", "share"),
    )
    preparer = node.preparer()
    await preparer.reconcile()
    (claim,) = await prepared(preparer, ref)

    assert [(d.request_names, d.pool, d.device) for d in claim.devices] == [
        (("whole",), POOL, "gpu-0"),
        (("share",), POOL, "gpu-1"),
    ]
    assert claim.cdi_device_id == f"{DRIVER}/claim={ref.uid}"
    [(key, devices)] = node.held().items()
    assert key == container_key(ref.uid)
    assert [(d.device_id, d.core_percent, d.memory_percent) for d in devices] == [
        (node.gpu(0), 100, 100),
        (node.gpu(1), 30, 25),  # 20 GiB of 80 GiB
    ]
    (allocation,) = await node.runtime.list_allocations()
    assert (allocation.claim_uid, allocation.claim_name, allocation.pod_namespace) == (
        ref.uid,
        "train",
        ns,
    )
    assert allocation.pod_uid == ""
    assert allocation.container_name == ""

    spec = json.loads(CdiSpecs(node.cdi_dir, DRIVER).path(ref.uid).read_text())
    assert spec["kind"] == f"{DRIVER}/claim"
    assert tuple(int(x) for x in spec["cdiVersion"].split(".")) >= (0, 6, 0)
    (device,) = spec["devices"]
    assert device["name"] == ref.uid
    edits = device["containerEdits"]
    assert f"LJ_VISIBLE_DEVICES={node.gpu(0)},{node.gpu(1)}" in edits["env"]
    assert edits["deviceNodes"]
    assert all(n["path"] and n["hostPath"] and n["permissions"] for n in edits["deviceNodes"])
    assert edits["mounts"]
    assert all("ro" in m["options"] for m in edits["mounts"])
    assert not list(node.cdi_dir.glob(".*")), "a temporary file was left"
    reread = Checkpoint(node.state_dir)
    reread.load()
    assert reread.claims[ref.uid] == claim


async def test_repeats_and_sharing_pods_prepare_once(node: Node, ns: str) -> None:
    ref = write_claim(node.kube, ns, "shared", [result("gpu-2")])
    preparer = node.preparer()
    await preparer.reconcile()
    # two pods sharing the claim, and the kubelet repeating a call it gave up on
    first, second = await asyncio.gather(preparer.prepare([ref]), preparer.prepare([ref, ref]))
    again = await preparer.prepare([ref])
    assert first == second == again
    assert list(node.held()) == [container_key(ref.uid)]
    # the second pod's unprepare comes after the first's: the claim is gone once
    assert await preparer.unprepare([ref]) == {ref.uid: ""}
    assert await preparer.unprepare([ref]) == {ref.uid: ""}
    assert node.held() == {}
    assert node.specs() == []


@pytest.mark.parametrize(
    ("case", "results", "refused"),
    [
        ("unallocated", None, "is not allocated"),
        ("other-pool", [result("gpu-0", pool="node-b")], "is in pool node-b, not this node's"),
        ("gone-device", [result("gpu-42")], "device gpu-42 is not in the Runtime's inventory"),
        (
            "nothing",
            [result("gpu-0", consumed={"cores": "0", "memory": "0"})],
            "a slice of 0 cores and 0 memory",
        ),
        ("over", [result("gpu-0", consumed={"cores": "101"})], "more than the device has"),
        # Admin access is granted beside the device's holder: allocating it in the Runtime
        # would take the device from (or fail against) the claim the scheduler counts.
        (
            "admin-access",
            [{**result("gpu-0"), "adminAccess": True}],
            "device gpu-0 is allocated with admin access, which this driver does not serve",
        ),
        (
            "two-shares-past",
            [
                result("gpu-3", "a", consumed={"cores": "60", "memory": "1Gi"}),
                result("gpu-3", "b", consumed={"cores": "60", "memory": "1Gi"}),
            ],
            "add up to 120 % cores",
        ),
    ],
)
async def test_refused_claims_leave_nothing(
    node: Node, ns: str, case: str, results: list[dict[str, Any]] | None, refused: str
) -> None:
    requests = sorted({r["request"] for r in results or [{"request": "gpu"}]})
    if any(r.get("adminAccess") for r in results or ()):
        label = {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}
        node.kube.request("PATCH", f"/api/v1/namespaces/{ns}", label, content_type=MERGE_PATCH)
    ref = write_claim(node.kube, ns, case, results, requests)
    ok = write_claim(node.kube, ns, f"{case}-ok", [result("gpu-7")])
    preparer = node.preparer()
    await preparer.reconcile()
    outcomes = await preparer.prepare([ref, ok])
    error = outcomes[ref.uid]
    assert isinstance(error, str), error
    assert refused in error
    assert f"{ns}/{case}" in error
    assert not isinstance(outcomes[ok.uid], str)
    assert list(node.held()) == [container_key(ok.uid)]
    assert node.specs() == [CdiSpecs(node.cdi_dir, DRIVER).path(ok.uid).name]
    assert set(preparer.prepared) == {ok.uid}


async def test_stale_uid_is_refused(node: Node, ns: str) -> None:
    ref = write_claim(node.kube, ns, "reused", [result("gpu-0")])
    node.kube.request("DELETE", claim_path(ns, "reused"))
    newer = write_claim(node.kube, ns, "reused", [result("gpu-1")])
    preparer = node.preparer()
    await preparer.reconcile()
    outcomes = await preparer.prepare([ref])
    assert outcomes[ref.uid] == (
        f"{ref} is stale: the API server's claim of that name has UID {newer.uid}"
    )
    assert node.held() == {}
    assert node.specs() == []


async def test_two_shares_of_one_device_are_one_runtime_share(node: Node, ns: str) -> None:
    ref = write_claim(
        node.kube,
        ns,
        "halves",
        [
            result("gpu-4", "a", consumed={"cores": "50", "memory": f"{40 * GIB}"}),
            result("gpu-4", "b", consumed={"cores": "25", "memory": f"{8 * GIB}"}),
        ],
        requests=("a", "b"),
    )
    preparer = node.preparer()
    await preparer.reconcile()
    (claim,) = await prepared(preparer, ref)
    assert [d.device for d in claim.devices] == ["gpu-4", "gpu-4"]
    assert [
        (d.device_id, d.core_percent, d.memory_percent) for d in node.held()[container_key(ref.uid)]
    ] == [(node.gpu(4), 75, 60)]


async def test_runtime_refusals_leave_nothing_held(node: Node, ns: str) -> None:
    taken = write_claim(node.kube, ns, "taken", [result("gpu-5"), result("gpu-6")])
    free = write_claim(node.kube, ns, "free", [result("gpu-0")])
    # another holder has GPU 6 whole: the claim's Allocate is refused as a whole
    await node.runtime.allocate(
        pb.AllocateRequest(
            container_key="pod-x/main",
            pod_uid="pod-x",
            pod_namespace=ns,
            devices=[pb.DeviceRequest(device_id=node.gpu(6))],
        )
    )
    preparer = node.preparer()
    await preparer.reconcile()
    outcomes = await preparer.prepare([taken, free])
    error = outcomes[taken.uid]
    assert isinstance(error, str)
    assert "RESOURCE_EXHAUSTED" in error
    assert str(taken) in error
    assert not isinstance(outcomes[free.uid], str)
    assert set(node.held()) == {"pod-x/main", container_key(free.uid)}
    assert node.specs() == [CdiSpecs(node.cdi_dir, DRIVER).path(free.uid).name]

    # an injected Runtime failure, with nothing held before it
    failing = write_claim(node.kube, ns, "failing", [result("gpu-1")])
    node.sim.faults.fail_allocations(0, 1)
    error = (await preparer.prepare([failing]))[failing.uid]
    assert isinstance(error, str)
    assert "Allocate" in error
    assert container_key(failing.uid) not in node.held()
    assert set(preparer.prepared) == {free.uid}


async def test_unwritable_cdi_spec_releases_the_allocation(node: Node, ns: str) -> None:
    blocked = write_claim(node.kube, ns, "blocked", [result("gpu-2")])
    node.cdi_dir.parent.joinpath("file").write_text("not a directory")
    preparer = node.preparer(cdi_dir=node.cdi_dir.parent / "file" / "cdi")
    await preparer.reconcile()
    error = (await preparer.prepare([blocked]))[blocked.uid]
    assert isinstance(error, str)
    assert "cannot write CDI spec" in error
    assert str(blocked) in error
    assert node.held() == {}
    assert preparer.prepared == {}


async def test_plugin_restart_between_prepare_and_unprepare(node: Node, ns: str) -> None:
    ref = write_claim(node.kube, ns, "kept", [result("gpu-3")])
    first = node.preparer()
    await first.reconcile()
    (claim,) = await prepared(first, ref)

    restarted = node.preparer()
    done = await restarted.reconcile()
    assert (done.reallocated, done.released, done.removed_specs) == ((), (), ())
    assert restarted.prepared == {ref.uid: claim}
    assert await restarted.prepare([ref]) == {ref.uid: claim}  # the kubelet repeats it
    assert list(node.held()) == [container_key(ref.uid)]
    assert await restarted.unprepare([ref]) == {ref.uid: ""}
    assert node.held() == {}
    assert node.specs() == []
    assert restarted.prepared == {}


async def test_runtime_restart_that_lost_allocations(node: Node, ns: str) -> None:
    ref = write_claim(node.kube, ns, "lost", [result("gpu-1", consumed={"cores": "40"})])
    preparer = node.preparer()
    await preparer.reconcile()
    (claim,) = await prepared(preparer, ref)
    CdiSpecs(node.cdi_dir, DRIVER).remove(ref.uid)
    await node.restart_runtime()
    assert node.held() == {}

    restarted = node.preparer()
    done = await restarted.reconcile()
    assert done.reallocated == (ref.uid,)
    assert [
        (d.device_id, d.core_percent, d.memory_percent) for d in node.held()[container_key(ref.uid)]
    ] == [(node.gpu(1), 40, 100)]
    assert node.specs() == [CdiSpecs(node.cdi_dir, DRIVER).path(ref.uid).name]
    # a Runtime restart while the plugin runs: the kubelet's repeated prepare holds it again
    await node.restart_runtime()
    assert await restarted.prepare([ref]) == {ref.uid: claim}
    assert list(node.held()) == [container_key(ref.uid)]


async def test_runtime_restart_while_running_gives_the_claims_back_once(
    node: Node, ns: str
) -> None:
    kept = write_claim(node.kube, ns, "kept", [result("gpu-1", consumed={"cores": "40"})])
    whole = write_claim(node.kube, ns, "whole", [result("gpu-2")])
    gone = write_claim(node.kube, ns, "gone", [result("gpu-3")])
    preparer = node.preparer()
    await preparer.reconcile()
    claims = await prepared(preparer, kept, whole, gone)
    before = node.held()
    await preparer.restore_lost()  # the Runtime lost nothing
    assert node.held() == before

    await node.restart_runtime()
    assert node.held() == {}
    # the checkpoint in memory is current: the files are not read again
    for path in Checkpoint(node.state_dir).directory.iterdir():
        path.write_text("{")
    # the Runtime is back while the kubelet repeats one claim and unprepares another
    _, repeated, unprepared = await asyncio.gather(
        preparer.restore_lost(), preparer.prepare([kept]), preparer.unprepare([gone])
    )
    assert repeated == {kept.uid: claims[0]}
    assert unprepared == {gone.uid: ""}
    assert node.held() == {k: v for k, v in before.items() if k != container_key(gone.uid)}
    assert len(node.sim.allocator.allocations()) == 2, "a claim is held twice"
    assert node.specs() == sorted(
        CdiSpecs(node.cdi_dir, DRIVER).path(r.uid).name for r in (kept, whole)
    )
    await preparer.restore_lost()
    assert node.held() == {k: v for k, v in before.items() if k != container_key(gone.uid)}
    assert len(node.sim.allocator.allocations()) == 2


async def test_repeat_while_the_runtime_is_away_keeps_the_claim(node: Node, ns: str) -> None:
    ref = write_claim(node.kube, ns, "away", [result("gpu-5")])
    preparer = node.preparer()
    await preparer.reconcile()
    (claim,) = await prepared(preparer, ref)
    spec = CdiSpecs(node.cdi_dir, DRIVER).path(ref.uid)
    await node.sim.stop(0)
    error = (await preparer.prepare([ref]))[ref.uid]
    assert isinstance(error, str)
    assert "not reachable" in error
    assert spec.exists(), "a prepared claim's CDI spec was removed"
    assert preparer.prepared == {ref.uid: claim}
    # a claim refused by the inventory as last seen is refused for its own reason
    unallocated = write_claim(node.kube, ns, "unallocated", None)
    inventory = [pb.Device(id="GPU-0", index=0)]
    error = (await node.preparer(inventory=lambda: inventory).prepare([unallocated]))[
        unallocated.uid
    ]
    assert error == f"{unallocated} is not allocated (status.allocation is empty)"
    cold = (await node.preparer().prepare([unallocated]))[unallocated.uid]
    assert isinstance(cold, str)
    assert "cannot read the Runtime's devices" in cold
    node.sim = Simulator(node.sim.node, node.sim.socket_dir)
    await node.sim.start()
    await preparer.restore_lost()
    assert list(node.held()) == [container_key(ref.uid)]
    assert await preparer.prepare([ref]) == {ref.uid: claim}


async def test_devices_come_from_the_inventory_provider(node: Node, ns: str) -> None:
    runtime = node.runtime
    assert isinstance(runtime, CountingRuntime)
    devices = await runtime.list_devices()
    seen: list[Sequence[pb.Device] | None] = [devices]
    preparer = node.preparer(inventory=lambda: seen[0])
    await preparer.reconcile()
    runtime.list_calls = 0
    known = write_claim(node.kube, ns, "known", [result("gpu-0", consumed={"cores": "10"})])
    await prepared(preparer, known)
    assert runtime.list_calls == 0
    # a device the provider does not know yet: the Runtime is asked
    seen[0] = [d for d in devices if d.index != 5]
    fresh = write_claim(node.kube, ns, "fresh", [result("gpu-5")])
    await prepared(preparer, fresh)
    assert runtime.list_calls == 1
    # no inventory yet (the publisher has not read it): the Runtime is asked
    seen[0] = None
    cold = write_claim(node.kube, ns, "cold", [result("gpu-6")])
    await prepared(preparer, cold)
    assert runtime.list_calls == 2
    # a device neither knows is refused
    seen[0] = devices
    ghost = write_claim(node.kube, ns, "ghost", [result("gpu-42")])
    error = (await preparer.prepare([ghost]))[ghost.uid]
    assert isinstance(error, str)
    assert "device gpu-42 is not in the Runtime's inventory" in error
    assert runtime.list_calls == 3
    assert set(node.held()) == {container_key(r.uid) for r in (known, fresh, cold)}


async def test_start_releases_allocations_nobody_knows(node: Node, ns: str) -> None:
    live = write_claim(node.kube, ns, "live", [result("gpu-0")])
    gone = write_claim(node.kube, ns, "gone", [result("gpu-1")])
    replaced = write_claim(node.kube, ns, "replaced", [result("gpu-2")])
    # held by the Runtime from a plugin that crashed before its checkpoint was written
    for ref, index in ((live, 0), (gone, 1), (replaced, 2)):
        await node.runtime.allocate(
            pb.AllocateRequest(
                container_key=container_key(ref.uid),
                pod_namespace=ns,
                devices=[pb.DeviceRequest(device_id=node.gpu(index))],
                claim_uid=ref.uid,
                claim_name=ref.name,
            )
        )
    node.kube.request("DELETE", claim_path(ns, "gone"))
    node.kube.request("DELETE", claim_path(ns, "replaced"))
    write_claim(node.kube, ns, "replaced", [result("gpu-2")])
    CdiSpecs(node.cdi_dir, DRIVER).write(gone.uid, pb.InjectionSpec())

    preparer = node.preparer()
    done = await preparer.reconcile()
    assert sorted(done.released) == sorted([gone.uid, replaced.uid])
    assert done.removed_specs == (gone.uid,)
    assert list(node.held()) == [container_key(live.uid)]
    # the live claim is the kubelet's to prepare: the same allocation, not a second one
    await prepared(preparer, live)
    assert list(node.held()) == [container_key(live.uid)]


async def test_unprepare_unknown_claim_succeeds(node: Node, ns: str) -> None:
    preparer = node.preparer()
    await preparer.reconcile()
    ghost = ClaimRef(ns, "ghost", str(uuid.uuid4()))
    assert await preparer.unprepare([ghost]) == {ghost.uid: ""}


def checkpointed(uid: str) -> PreparedClaim:
    """A prepared claim of one TDM share."""
    share = DeviceShare("GPU-x", 30, 25)
    return PreparedClaim(
        ClaimRef("ns", f"c-{uid}", uid),
        (ClaimDevice(("gpu",), POOL, "gpu-0", share),),
        (share,),
        f"{DRIVER}/claim={uid}",
    )


def test_damaged_checkpoint_is_refused(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path)
    checkpoint.put(checkpointed("u-1"))
    path = checkpoint.path("u-1")
    good = path.read_text()
    doc = json.loads(good)
    doc["claim"]["name"] = "other"
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=f"checkpoint {path} does not match its checksum"):
        Checkpoint(tmp_path).load()
    path.write_text("{")
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is unreadable"):
        Checkpoint(tmp_path).load()
    path.write_text(good.replace('"version": 2', '"version": 9'))
    with pytest.raises(CheckpointError, match=f"checkpoint {path} has version 9, expected 2"):
        Checkpoint(tmp_path).load()
    other = checkpoint.path("u-2")
    other.write_text(good)
    path.write_text(good)
    with pytest.raises(CheckpointError, match=f"checkpoint {other} holds claim UID u-1"):
        Checkpoint(tmp_path).load()


def test_checkpoint_writes_only_the_claim_it_changes(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path)
    for i in range(3):
        checkpoint.put(checkpointed(f"u-{i}"))
    before = {p.name: os.stat(p) for p in checkpoint.directory.iterdir()}
    checkpoint.put(checkpointed("u-3"))
    checkpoint.drop("u-1")
    after = {p.name: os.stat(p) for p in checkpoint.directory.iterdir()}
    assert sorted(after) == ["u-0.json", "u-2.json", "u-3.json"], "a temporary file was left"
    for name in ("u-0.json", "u-2.json"):
        assert (after[name].st_ino, after[name].st_mtime_ns) == (
            before[name].st_ino,
            before[name].st_mtime_ns,
        ), f"{name} was written again"
    reread = Checkpoint(tmp_path)
    reread.load()
    assert reread.claims == {u: checkpointed(u) for u in ("u-0", "u-2", "u-3")}
    # a write a crash interrupted is no claim
    (checkpoint.directory / ".u-4.json.tmp").write_text("{")
    reread.load()
    assert set(reread.claims) == {"u-0", "u-2", "u-3"}
    assert not list(checkpoint.directory.glob(".*"))


def test_checkpoint_of_the_single_file_format_is_split(tmp_path: Path) -> None:
    """A plugin upgraded from the single checkpoint file keeps every claim."""
    entries = {
        uid: {
            "namespace": "ns",
            "name": f"c-{uid}",
            "devices": [
                {
                    "requests": ["gpu"],
                    "pool": POOL,
                    "device": "gpu-0",
                    "share": {"id": "GPU-x", "cores": 30, "memory": 25},
                }
            ],
            "shares": [{"id": "GPU-x", "cores": 30, "memory": 25}],
            "cdi": f"{DRIVER}/claim={uid}",
        }
        for uid in ("u-1", "u-2")
    }
    checksum = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()
    legacy = tmp_path / "checkpoint.json"
    legacy.write_text(json.dumps({"version": 1, "checksum": checksum, "claims": entries}))
    checkpoint = Checkpoint(tmp_path)
    checkpoint.load()
    assert checkpoint.claims == {u: checkpointed(u) for u in ("u-1", "u-2")}
    assert not legacy.exists()
    assert sorted(p.name for p in checkpoint.directory.iterdir()) == ["u-1.json", "u-2.json"]
    reread = Checkpoint(tmp_path)
    reread.load()
    assert reread.claims == checkpoint.claims

    entries["u-1"]["name"] = "other"
    legacy.write_text(json.dumps({"version": 1, "checksum": checksum, "claims": entries}))
    with pytest.raises(CheckpointError, match=f"checkpoint {legacy} does not match its checksum"):
        Checkpoint(tmp_path).load()
    legacy.write_text(json.dumps({"version": 7, "checksum": checksum, "claims": entries}))
    with pytest.raises(CheckpointError, match=f"checkpoint {legacy} has version 7, expected 1"):
        Checkpoint(tmp_path).load()


async def test_claim_of_other_drivers_only_holds_nothing(node: Node, ns: str) -> None:
    ref = write_claim(node.kube, ns, "foreign", [result("nic-0", driver="net.example.com")])
    preparer = node.preparer()
    await preparer.reconcile()
    (claim,) = await prepared(preparer, ref)
    assert claim.devices == ()
    assert node.held() == {}
    assert node.specs() == []


async def test_repeat_is_answered_from_the_checkpoint_while_the_api_server_is_away(
    node: Node, ns: str, tmp_path: Path
) -> None:
    ref = write_claim(node.kube, ns, "offline", [result("gpu-6")])
    preparer = node.preparer()
    await preparer.reconcile()
    (claim,) = await prepared(preparer, ref)

    kubeconfig = unreachable_kubeconfig(tmp_path)
    node.kube = KubeClient.connect(str(kubeconfig))
    restarted = node.preparer()
    await restarted.reconcile()
    assert await restarted.prepare([ref]) == {ref.uid: claim}
    assert list(node.held()) == [container_key(ref.uid)]
    other = ClaimRef(ns, "unknown", str(uuid.uuid4()))
    error = (await restarted.prepare([other]))[other.uid]
    assert isinstance(error, str)
    assert "cannot read it from the API server" in error
