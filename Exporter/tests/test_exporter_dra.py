"""DRA mode: the Runtime holds one allocation per ResourceClaim ("claim/<uid>"); the kubelet's
PodResources API (a test server on a unix socket) says which containers use each claim. The
Exporter gives a claim's usage and shares to every container using it, counts the claim once
in the device series, and keeps the per-device series as the Runtime reports them."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit.exporter.internal.allocation.assignments import (
    Allocations,
    runtime_share,
    with_claims,
)
from lj_runtimekit.exporter.internal.pods.model import Pod
from lj_runtimekit.exporter.internal.pods.podresources import ClaimUser
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2 as prpb
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2_grpc as prgrpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.proto.pkg.runtimeclient import RuntimeClient
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

UTIL = "lj_runtimekit_container_utilization_ratio"
MEM_USED = "lj_runtimekit_container_memory_used_bytes"


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim the Runtime holds, and the containers the kubelet says use it."""

    uid: str
    namespace: str
    name: str
    devices: tuple[pb.DeviceRequest, ...]
    users: tuple[ClaimUser, ...]


class PodResourcesServer(prgrpc.PodResourcesListerServicer):
    """The kubelet's PodResourcesLister (List) on a unix socket, answering `claims`' users."""

    def __init__(self, socket_path: Path, claims: Sequence[Claim]) -> None:
        self.socket_path = socket_path
        self.calls = 0
        response = prpb.ListPodResourcesResponse()
        pods: dict[tuple[str, str], prpb.PodResources] = {}
        for claim in claims:
            for user in claim.users:
                key = (user.pod_namespace, user.pod_name)
                if key not in pods:
                    pods[key] = response.pod_resources.add(
                        namespace=user.pod_namespace, name=user.pod_name
                    )
                container = next(
                    (c for c in pods[key].containers if c.name == user.container), None
                ) or pods[key].containers.add(name=user.container)
                container.dynamic_resources.add(
                    claim_name=claim.name, claim_namespace=claim.namespace
                )
        self._response = response
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prgrpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{socket_path}")

    def List(
        self, request: prpb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> prpb.ListPodResourcesResponse:
        """Count the call; answer the claims' users."""
        self.calls += 1
        return self._response

    def Get(
        self, request: prpb.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> prpb.GetPodResourcesResponse:
        """Not used by the Exporter."""
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Get")

    def GetAllocatableResources(
        self, request: prpb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> prpb.AllocatableResourcesResponse:
        """Not used by the Exporter."""
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources")

    def start(self) -> PodResourcesServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)


def allocate_claims(socket_dir: Path, claims: Sequence[Claim]) -> list[pb.Device]:
    """Allocate each claim once, as the DRA kubelet plugin does; return the inventory."""

    async def go() -> list[pb.Device]:
        async with RuntimeClient(socket_dir) as client:
            for claim in claims:
                await client.allocate(
                    pb.AllocateRequest(
                        container_key=f"claim/{claim.uid}",
                        pod_namespace=claim.namespace,
                        claim_uid=claim.uid,
                        claim_name=claim.name,
                        devices=claim.devices,
                    )
                )
            return await client.list_devices()

    return asyncio.run(go())


@dataclass
class Bed:
    exporter: Any
    devices: list[pb.Device]
    claims: dict[str, Claim]
    expected: pb.GetDeviceMetricsResponse
    expected_containers: pb.GetContainerMetricsResponse
    scrape: Any
    pod_resources: PodResourcesServer


NODE = EXAMPLE_NODES / "mig-8gpu.yaml"


def _claims(devices: list[pb.Device]) -> dict[str, Claim]:
    mig = devices[7].mig_instances[0]
    return {
        # one whole GPU shared by two containers of one pod and a container of another pod
        "shared": Claim(
            "uid-claim-a",
            "team-a",
            "train-gpu",
            (pb.DeviceRequest(device_id=devices[0].id),),
            (
                ClaimUser("team-a", "train-0", "main"),
                ClaimUser("team-a", "train-0", "sidecar"),
                ClaimUser("team-a", "eval-1", "eval"),
            ),
        ),
        # a TDM slice (30 % core, 25 % memory) used by one container
        "slice": Claim(
            "uid-claim-b",
            "team-b",
            "infer-slice",
            (
                pb.DeviceRequest(
                    device_id=devices[1].id, core_percent=30, memory_percent=25, slice=True
                ),
            ),
            (ClaimUser("team-b", "infer-2", "c"),),
        ),
        # a MIG instance prepared for a pod not running yet: no container uses it
        "waiting": Claim(
            "uid-claim-c",
            "team-b",
            "mig-claim",
            (pb.DeviceRequest(device_id=mig.id),),
            (),
        ),
    }


def _pods(lj: Any) -> list[Any]:
    return [
        lj.PodSpec("uid-p1", "team-a", "train-0", ("main", "sidecar"), {}),
        lj.PodSpec("uid-p2", "team-a", "eval-1", ("eval",), {}),
        lj.PodSpec("uid-p3", "team-b", "infer-2", ("c",), {}),
        lj.PodSpec("uid-p4", "team-b", "legacy-3", ("x",), {}),
    ]


@pytest.fixture(scope="module")
def bed(lj: Any) -> Iterator[Bed]:
    base = lj.short_dir()
    with SimulatorProcess(base / "a", NODE) as sim, SimulatorProcess(base / "b", NODE) as twin:
        devices = allocate_claims(sim.socket_dir, [])
        claims = _claims(devices)
        pods = _pods(lj)
        legacy = [lj.Grant(pods[3], "x", lj.DeviceShare(devices[2].id))]
        for socket_dir in (sim.socket_dir, twin.socket_dir):
            allocate_claims(socket_dir, list(claims.values()))
            lj.allocate(socket_dir, legacy)
        lj.annotate(legacy, lj.PROTOCOL.annotations.allocated_devices)
        kubelet = lj.kubelet_pods(pods)
        server = PodResourcesServer(base / "pr.sock", list(claims.values())).start()
        exporter = lj.ExporterProcess(
            [
                "--runtime-socket-dir",
                str(sim.socket_dir),
                "--kubelet-pods-url",
                kubelet.url,
                "--pod-resources-socket",
                str(server.socket_path),
                "--collection-interval",
                "3600",  # one collection: the twin's first sample is the exporter's
            ],
            base,
        )
        try:
            scrape = exporter.wait_scrape(
                "the first collection",
                lambda s: bool(s.select("lj_runtimekit_runtime_up", node="node-a")),
            )
            expected, expected_containers = lj.runtime_samples(twin.socket_dir)
            yield Bed(exporter, devices, claims, expected, expected_containers, scrape, server)
        finally:
            exporter.stop()
            server.stop()
            kubelet.stop()


def _claim_sample(bed: Bed, claim: Claim) -> pb.ContainerMetrics:
    (sample,) = [
        c for c in bed.expected_containers.containers if c.container_key == f"claim/{claim.uid}"
    ]
    return sample


def test_simulator_reports_a_claim_as_one_holder_keyed_by_its_uid(bed: Bed) -> None:
    keys = sorted(c.container_key for c in bed.expected_containers.containers)
    assert keys == ["claim/uid-claim-a", "claim/uid-claim-b", "claim/uid-claim-c", "uid-p4/x"]
    sample = _claim_sample(bed, bed.claims["shared"])
    assert (sample.pod_namespace, sample.container_name) == ("team-a", "")


def test_claim_usage_goes_to_every_container_using_it(bed: Bed) -> None:
    s = bed.scrape
    claim = bed.claims["shared"]
    sample = _claim_sample(bed, claim)
    assert sample.utilization_ratio > 0
    series = s.select(UTIL, device="0")
    assert sorted((lab["namespace"], lab["pod"], lab["container"]) for lab, _ in series) == [
        ("team-a", "eval-1", "eval"),
        ("team-a", "train-0", "main"),
        ("team-a", "train-0", "sidecar"),
    ]
    assert {value for _, value in series} == {sample.utilization_ratio}
    assert {v for _, v in s.select(MEM_USED, device="0")} == {sample.memory_used_bytes}
    slice_sample = _claim_sample(bed, bed.claims["slice"])
    assert s.value(UTIL, pod="infer-2", container="c") == slice_sample.utilization_ratio
    # a claim no running container uses yet has no container series; the pod-annotation
    # container keeps its own
    assert s.select(UTIL, device="7") == []
    assert len(s.select(UTIL, pod="legacy-3")) == 1
    assert len(s.select(UTIL)) == 5


def test_device_series_count_a_shared_claim_once(bed: Bed) -> None:
    s = bed.scrape

    def device(index: int, name: str) -> float:
        return float(s.value(f"lj_runtimekit_device_{name}", device=str(index)))

    # per-device samples are the Runtime's, whoever holds the device
    for d in bed.expected.devices[:3]:
        index = next(x.index for x in bed.devices if x.id == d.device_id)
        assert device(index, "utilization_ratio") == d.utilization_ratio
        assert device(index, "memory_used_bytes") == d.memory_used_bytes
    # the shared whole GPU is allocated once (1, not 3), to three containers
    assert (device(0, "core_allocated_ratio"), device(0, "memory_allocated_ratio")) == (1, 1)
    assert device(0, "allocated_containers") == 3
    assert (device(1, "core_allocated_ratio"), device(1, "memory_allocated_ratio")) == (0.3, 0.25)
    assert device(1, "allocated_containers") == 1
    # the waiting claim's MIG instance (3g.40gb: 3/7 of GPU 7, half its memory) is allocated
    assert device(7, "core_allocated_ratio") == pytest.approx(3 / 7, abs=1e-6)
    assert device(7, "memory_allocated_ratio") == 0.5
    assert device(7, "allocated_containers") == 0
    assert device(2, "core_allocated_ratio") == 1  # the pod-annotation allocation
    labels = {"pod": "train-0", "container": "sidecar", "device": "0"}
    assert s.value("lj_runtimekit_container_core_allocated_ratio", **labels) == 1
    labels = {"pod": "infer-2", "container": "c", "device": "1"}
    assert s.value("lj_runtimekit_container_core_allocated_ratio", **labels) == 0.3
    assert s.value("lj_runtimekit_container_memory_allocated_ratio", **labels) == 0.25
    assert s.value("lj_runtimekit_exporter_collection_errors_total", source="podresources") == 0
    assert bed.pod_resources.calls == 1


def test_promtool_check_metrics_passes_with_claims(bed: Bed, lj: Any) -> None:
    promtool = lj.require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=bed.scrape.text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_without_pod_resources_claims_still_count_on_their_devices(lj: Any) -> None:
    base = lj.short_dir()
    with SimulatorProcess(base / "a", NODE) as sim:
        claims = _claims(allocate_claims(sim.socket_dir, []))
        allocate_claims(sim.socket_dir, list(claims.values()))
        kubelet = lj.kubelet_pods(_pods(lj))
        socket_path = base / "pr.sock"  # nothing listens there yet
        exporter = lj.ExporterProcess(
            [
                "--runtime-socket-dir",
                str(sim.socket_dir),
                "--kubelet-pods-url",
                kubelet.url,
                "--pod-resources-socket",
                str(socket_path),
                "--collection-interval",
                "0.5",
            ],
            base,
        )
        server: PodResourcesServer | None = None
        try:
            errors = "lj_runtimekit_exporter_collection_errors_total"
            s = exporter.wait_scrape(
                "a collection without PodResources",
                lambda s: s.value(errors, source="podresources") >= 1,
            )
            assert s.value("lj_runtimekit_device_core_allocated_ratio", device="0") == 1
            assert s.value("lj_runtimekit_device_allocated_containers", device="0") == 0
            assert s.select(UTIL) == []
            assert "PodResources unreadable" in exporter.log()
            server = PodResourcesServer(socket_path, list(claims.values())).start()
            s = exporter.wait_scrape(
                "the claims attributed once PodResources answers",
                lambda s: len(s.select(UTIL)) == 4,
            )
            assert s.value("lj_runtimekit_device_allocated_containers", device="0") == 3
            assert "PodResources readable" in exporter.log()
        finally:
            exporter.stop()
            if server is not None:
                server.stop()
            kubelet.stop()


# -- pure logic ---------------------------------------------------------------------------


def test_runtime_share_reads_the_contract() -> None:
    assert runtime_share(pb.DeviceRequest(device_id="g")) == DeviceShare("g")
    assert runtime_share(pb.DeviceRequest(device_id="g", core_percent=100, memory_percent=100)) == (
        DeviceShare("g")
    )
    sliced = pb.DeviceRequest(device_id="g", core_percent=30, memory_percent=0, slice=True)
    assert runtime_share(sliced) == DeviceShare("g", 30, 0)
    legacy = pb.DeviceRequest(device_id="g", core_percent=30)  # 0 memory = all of it
    assert runtime_share(legacy) == DeviceShare("g", 30, 100)


def test_with_claims_skips_finished_and_unknown_pods() -> None:
    claim = pb.Allocation(
        container_key="claim/u",
        pod_namespace="ns",
        claim_uid="u",
        claim_name="c",
        devices=[pb.DeviceRequest(device_id="g")],
    )
    pods = [
        Pod("p1", "ns", "run", "Running", "n", ("a",)),
        Pod("p2", "ns", "done", "Succeeded", "n", ("b",)),
    ]
    users = {
        ("ns", "c"): (ClaimUser("ns", "run", "a"), ClaimUser("ns", "done", "b")),
        ("other", "c"): (ClaimUser("other", "run", "z"),),
    }
    out = with_claims(Allocations({}, {}), [claim], users, pods)
    assert out.claim_users == {"u": (("p1", "a"),)}
    assert out.by_container == {("p1", "a"): {"g": DeviceShare("g")}}
    assert (out.by_device["g"].core_percent, out.by_device["g"].containers) == (100, 1)
