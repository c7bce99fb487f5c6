"""`verify --dra` compares each DRA node's ResourceSlices with its Runtime's inventory, on a
real control plane of the DRA mode's release (DRA_VERSION): the DRA plugin's slice publisher
writes a node's pool from a Runtime simulator, the Exporter's own metric families read the same
simulator (what verify reads through the API server proxy), and the check reads the objects
back as deploy-all.sh's snapshot holds them (kubectl get -o json)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.deploy import cli, verify
from lj_runtimekit.deploy.components import BY_NAME, DRA_PLUGIN
from lj_runtimekit.deviceplugin.internal.dra.publisher import SlicePublisher
from lj_runtimekit.envtest import (
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    NodeFactory,
    dra_gates,
)
from lj_runtimekit.exporter.internal.collector.runtime import read_runtime
from lj_runtimekit.exporter.internal.metrics.families import build_families
from lj_runtimekit.exporter.internal.metrics.labels import LabelConfig
from lj_runtimekit.exporter.internal.metrics.registry import ExporterMetrics, status_families
from lj_runtimekit.exporter.internal.metrics.xid import XidCodes
from lj_runtimekit.proto.lingjun.runtimesim.v1 import admin_pb2, admin_pb2_grpc
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient
from lj_runtimekit.runtimesim.node import load_node_file
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES
from lj_runtimekit.runtimesim.server import RUNTIME_SOCKET, Simulator
from lj_runtimekit.testkit.waits import NotYet, wait_for

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = load_protocol(ROOT / "deploy" / "protocol.yaml")
DRIVER = PROTOCOL.dra.driver
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NS = "lj-verify"
LATER = timedelta(seconds=verify.PUBLISH_WINDOW_S + 60)
"""How much later than now a verify run sees a pool nobody wrote since."""
EXPORTER_APP = BY_NAME["exporter"].app


@pytest.fixture(scope="module")
def plane(dra_k8s_tools: object) -> Iterator[ControlPlane]:
    config = ControlPlaneConfig(
        version=DRA_VERSION, feature_gates=dra_gates(DRA_VERSION), scheduler=False
    )
    cp = ControlPlane(config).start()
    yield cp
    cp.stop()


class Node:
    """A node of the control plane with its Runtime simulator (an example node)."""

    def __init__(self, cp: ControlPlane, name: str, sim: Simulator, workdir: Path) -> None:
        self.cp = cp
        self.name = name
        self.sim = sim
        self.workdir = workdir
        self.kube = KubeClient.connect(str(cp.kubeconfig_path))

    def runtime(self) -> RuntimeClient:
        return RuntimeClient(self.workdir / "sim", RUNTIME_SOCKET, RetryPolicy(attempts=2))

    def slices(self) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={self.name},spec.driver={DRIVER}"
        items, _ = self.kube.list_all(SLICES, {"fieldSelector": selector})
        return sorted(items, key=lambda s: s["metadata"]["name"])

    async def publish(self) -> list[dict[str, Any]]:
        """Run the DRA plugin's publisher until the pool is complete, then stop it (so that
        what a test breaks stays broken)."""
        publisher = SlicePublisher(self.kube, self.runtime(), PROTOCOL, self.name)
        task = asyncio.create_task(publisher.run())

        def complete() -> list[dict[str, Any]] | NotYet:
            slices = self.slices()
            pools = [s["spec"]["pool"] for s in slices]
            whole = all(p["resourceSliceCount"] == len(pools) for p in pools)
            if pools and whole and len({p["generation"] for p in pools}) == 1:
                return slices
            return NotYet(str(pools))

        try:
            return await asyncio.to_thread(wait_for, complete, 30, f"the pool of {self.name}")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def exporter_metrics(self, *, dcgm: bool = False, runtime_up: bool = True) -> str:
        """The node's Exporter /metrics answer after one collection of its Runtime."""
        labels = LabelConfig(dcgm_names=dcgm)
        client = self.runtime()
        try:
            view = await read_runtime(client) if runtime_up else None
        finally:
            await client.close()
        metrics = ExporterMetrics()
        metrics.publish(
            [
                *status_families(
                    node=self.name,
                    component_version="test",
                    runtime_up=view is not None,
                    kubelet_up=None,
                    gates=view.gates if view else None,
                    last_gates=view.gates if view else None,
                    pods_source=None,
                    pods_count=0,
                    collected_at_unix=time.time(),
                    label_config=labels,
                ),
                *build_families(
                    self.name, PROTOCOL.resources, view, None, None, XidCodes(), labels
                ),
            ]
        )
        body, _ = metrics.render("")
        return body.decode()

    async def set_health(self, device_id: str, healthy: bool) -> None:
        async with grpc.aio.insecure_channel(f"unix:{self.sim.admin_path}") as channel:
            await admin_pb2_grpc.SimulatorAdminStub(channel).SetDeviceHealth(
                admin_pb2.SetDeviceHealthRequest(
                    device_id=device_id, healthy=healthy, reason="XID 79"
                )
            )

    def put(self, item: dict[str, Any]) -> None:
        self.kube.request("PUT", f"{SLICES}/{item['metadata']['name']}", item)


@contextlib.asynccontextmanager
async def node(
    cp: ControlPlane, tmp_path: Path, name: str, example: str = "mig-8gpu", *, dra: bool = True
) -> AsyncIterator[Node]:
    """A node (labelled dra when `dra`), its simulator and an Exporter pod object on it."""
    api = cp.api_client()
    factory = NodeFactory(api)
    labels = {PROTOCOL.labels.device_api: DRA_MODE} if dra else {}
    factory.create(name, gpus=0, wait=False, labels=labels)
    core = k8s_client.CoreV1Api(api)
    core.create_namespaced_pod(NS, exporter_pod(name))
    sim = Simulator(load_node_file(EXAMPLE_NODES / f"{example}.yaml"), tmp_path / name / "sim")
    await sim.start()
    n = Node(cp, name, sim, tmp_path / name)
    try:
        yield n
    finally:
        await sim.stop(0)
        n.kube.request("DELETE", f"{SLICES}?fieldSelector=spec.nodeName%3D{name}")
        core.delete_namespaced_pod(f"exporter-{name}", NS, grace_period_seconds=0)
        factory.cleanup()
        n.kube.close()
        api.close()


def exporter_pod(node_name: str) -> dict[str, Any]:
    """The Exporter DaemonSet's pod on a node, as the API server holds it."""
    return {
        "metadata": {"name": f"exporter-{node_name}", "labels": {"app": EXPORTER_APP}},
        "spec": {
            "nodeName": node_name,
            "automountServiceAccountToken": False,
            "containers": [{"name": "exporter", "image": "lj-exporter:test"}],
        },
    }


@pytest.fixture(scope="module")
def namespace(plane: ControlPlane) -> Iterator[str]:
    api = plane.api_client()
    k8s_client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
    yield NS
    api.close()


def kubectl_json(cp: ControlPlane, *args: str) -> list[dict[str, Any]]:
    """Items of `kubectl get ... -o json`, as deploy-all.sh's snapshot reads them."""
    out = subprocess.run(
        cp.kubectl_argv("get", *args, "-o", "json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def check(cp: ControlPlane, metrics: dict[str, str], now: datetime | None = None) -> verify.Report:
    """check_dra over the live nodes, pods and slices (with their managed fields' times)."""
    report = verify.check_dra(
        [],
        kubectl_json(cp, "pods", "-n", NS),
        kubectl_json(cp, "nodes"),
        [],
        kubectl_json(
            cp, "resourceslices", f"--field-selector=spec.driver={DRIVER}", "--show-managed-fields"
        ),
        [],
        PROTOCOL,
        NS,
        metrics=metrics,
        now=now or datetime.now(UTC),
    )
    return report


def verify_command(cp: ControlPlane, tmp: Path, metrics: dict[str, str]) -> list[str]:
    """`lj-deploy verify --dra` over a snapshot as deploy-all.sh writes it, with the Exporter
    pods' /metrics answers in its metrics directory: the lines it prints."""
    snap = tmp / "snapshot"
    (snap / "metrics").mkdir(parents=True, exist_ok=True)
    for name in ("workloads", "configmaps", "deviceclasses"):
        (snap / f"{name}.json").write_text('{"items": []}')
    for name, args in (
        ("pods", ("pods", "-n", NS)),
        ("nodes", ("nodes",)),
        ("resourceslices", ("resourceslices", f"--field-selector=spec.driver={DRIVER}")),
    ):
        (snap / f"{name}.json").write_text(json.dumps({"items": kubectl_json(cp, *args)}))
    for pod, text in metrics.items():
        (snap / "metrics" / f"{pod}.txt").write_text(text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(
            [
                "verify",
                "--dra",
                f"--snapshot={snap}",
                f"--metrics-dir={snap / 'metrics'}",
                f"--protocol={ROOT / 'deploy' / 'protocol.yaml'}",
                f"--namespace={NS}",
                "--components=exporter",
            ]
        )
    return out.getvalue().splitlines()


def about(report: verify.Report, node_name: str) -> list[str]:
    """The report's lines naming `node_name`, each with its level."""
    levels = (("ok", report.ok), ("info", report.info), ("PROBLEM", report.problems))
    return [f"{level} {line}" for level, lines in levels for line in lines if node_name in line]


FIX = (
    "fix: read its DRA plugin's log (kubectl -n {ns} get pods -l app={app} --field-selector"
    " spec.nodeName={node}, then kubectl logs), then restart it (kubectl -n {ns} delete pods"
    " -l app={app} --field-selector spec.nodeName={node})"
)


def fix(node_name: str) -> str:
    return FIX.format(ns=NS, app=DRA_PLUGIN.app, node=node_name)


async def test_a_good_node_passes(plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    """Devices in TDM mode and MIG instances, published by the plugin, read by the Exporter
    with its own label names and with dcgm-exporter's."""
    async with node(plane, tmp_path, "verify-good") as n:
        slices = await n.publish()
        count = sum(len(s["spec"].get("devices") or ()) for s in slices)
        assert len(slices) == 3, slices  # TDM GPUs, MIG instances, their GPUs' counter sets
        assert count > 8, slices
        for dcgm in (False, True):
            metrics = {f"exporter-{n.name}": await n.exporter_metrics(dcgm=dcgm)}
            assert about(check(plane, metrics), n.name) == [
                f"ok dra-plugin: node {n.name} publishes {count} device(s) of {DRIVER}, as its"
                f" Runtime reports them (Exporter pod {NS}/exporter-{n.name})"
            ]
        lines = verify_command(plane, tmp_path, metrics)
        assert (
            f"ok      dra-plugin: node {n.name} publishes {count} device(s) of {DRIVER}, as its"
            f" Runtime reports them (Exporter pod {NS}/exporter-{n.name})"
        ) in lines, lines
        assert about(check(plane, {}), n.name) == [
            f"ok dra-plugin: node {n.name} publishes {count} device(s) of {DRIVER}",
            f"info dra-plugin: node {n.name}: its slices are not compared with the Runtime: no"
            " Exporter /metrics read from the node (verify reads them with the exporter among"
            " --components, through the API server proxy or --metrics-url=POD=URL)",
        ]


async def test_a_dra_node_without_slices_or_with_another_pool(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with node(plane, tmp_path, "verify-empty") as n:
        metrics = {f"exporter-{n.name}": await n.exporter_metrics()}
        assert about(check(plane, metrics), n.name) == [
            f"PROBLEM dra-plugin: node {n.name} ({PROTOCOL.labels.device_api}=dra) publishes no"
            f" ResourceSlice of driver {DRIVER}; fix: read its DRA plugin's log (kubectl -n {NS}"
            f" get pods -l app={DRA_PLUGIN.app} --field-selector spec.nodeName={n.name}, then"
            " kubectl logs)"
        ]
        n.kube.request(
            "POST",
            SLICES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{n.name}-by-hand"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": n.name,
                    "pool": {"name": "by-hand", "generation": 1, "resourceSliceCount": 1},
                    "devices": [],
                },
            },
        )
        assert about(check(plane, metrics), n.name) == [
            f"PROBLEM dra-plugin: node {n.name}: ResourceSlices of driver {DRIVER} in pool(s)"
            " by-hand (the DRA plugin publishes one pool, named after the node); fix: kubectl"
            f" delete resourceslices --field-selector spec.driver={DRIVER},spec.nodeName={n.name},"
            f" then restart its DRA plugin (kubectl -n {NS} delete pods -l app={DRA_PLUGIN.app}"
            f" --field-selector spec.nodeName={n.name})"
        ]


async def test_a_pool_that_disagrees_with_the_runtime_names_each_device(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """A device gone from the pool, one the Runtime lacks, a wrong mode, a wrong memory, and
    health the Runtime changed while the plugin was away: one line for the node."""
    async with node(plane, tmp_path, "verify-wrong") as n:
        slices = await n.publish()
        devices = slices[0]["spec"]["devices"]
        by_name = {d["name"]: d for d in devices}
        gone = by_name.pop("gpu-0")
        by_name["gpu-1"]["attributes"]["mode"] = {"string": "exclusive"}
        by_name["gpu-2"]["capacity"]["memory"]["value"] = "1Gi"
        extra = copy.deepcopy(by_name["gpu-3"])
        extra["name"] = "gpu-99"
        extra["attributes"]["uuid"] = {"string": "GPU-not-on-this-node"}
        extra["attributes"]["index"] = {"int": 99}
        slices[0]["spec"]["devices"] = [*by_name.values(), extra]
        n.put(slices[0])
        unhealthy = by_name["gpu-4"]["attributes"]["uuid"]["string"]
        await n.set_health(unhealthy, False)
        metrics = {f"exporter-{n.name}": await n.exporter_metrics()}
        uuid = gone["attributes"]["uuid"]["string"]
        client = n.runtime()
        try:
            (gpu2,) = [d for d in await client.list_devices() if d.index == 2]
        finally:
            await client.close()
        generation = slices[0]["spec"]["pool"]["generation"]
        assert about(check(plane, metrics), n.name) == [
            f"PROBLEM dra-plugin: node {n.name}: pool {n.name} (generation {generation})"
            f" disagrees with the Runtime (as the Exporter pod {NS}/exporter-{n.name} reads it):"
            f" missing gpu 0 ({uuid}); gpu-1 mode exclusive (Runtime: tdm); gpu-2 memory 1Gi"
            f" (Runtime: {gpu2.memory_bytes}); gpu-4 untainted (Runtime: unhealthy); extra gpu-99"
            f" (GPU-not-on-this-node); {fix(n.name)}"
        ]


async def test_an_exporter_that_cannot_read_the_runtime_is_named(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with node(plane, tmp_path, "verify-down", "tdm-8gpu") as n:
        await n.publish()
        metrics = {f"exporter-{n.name}": await n.exporter_metrics(runtime_up=False)}
        assert about(check(plane, metrics), n.name) == [
            f"PROBLEM dra-plugin: node {n.name}: the Exporter pod {NS}/exporter-{n.name} reports"
            " no device inventory (lj_runtimekit_runtime_up 0: it cannot read the Runtime), so"
            f" the slices are not compared; fix: check the Runtime on {n.name}"
            f" (hack/node-precheck.sh) and kubectl -n {NS} logs exporter-{n.name}"
        ]


async def test_stale_pool_generations_beyond_the_publish_window(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """One slice of the pool a generation ahead: a publish under way just after the write, a
    stuck one when nothing wrote the pool for longer than the window."""
    async with node(plane, tmp_path, "verify-stale") as n:
        slices = await n.publish()
        generation = slices[0]["spec"]["pool"]["generation"]
        slices[0]["spec"]["pool"]["generation"] = generation + 1
        n.put(slices[0])
        metrics = {f"exporter-{n.name}": await n.exporter_metrics()}
        (line,) = about(check(plane, metrics), n.name)
        assert line.startswith(
            f"info dra-plugin: node {n.name}: pool {n.name} has slices at generations"
            f" {generation}, {generation + 1}, last written "
        ), line
        assert line.endswith(
            " s ago: a publish may be under way, its devices are not compared with the Runtime;"
            " run verify again"
        ), line
        (line,) = about(check(plane, metrics, datetime.now(UTC) + LATER), n.name)
        assert line.startswith(
            f"PROBLEM dra-plugin: node {n.name}: pool {n.name} has slices at generations"
            f" {generation}, {generation + 1}, last written "
        ), line
        assert line.endswith(
            f" s ago (a publish takes under {verify.PUBLISH_WINDOW_S} s): the scheduler sees 1 of"
            f" {len(slices)} slice(s) of generation {generation + 1}; {fix(n.name)}"
        ), line


async def test_slices_of_our_driver_on_a_node_not_in_dra_mode(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """Left by a node moved back to the Device Plugin: information while the kubelet may still
    delete them, a problem once nothing wrote them for longer than the window."""
    async with node(plane, tmp_path, "verify-moved", "tdm-8gpu", dra=False) as n:
        await n.publish()
        where = f"dra-plugin: ResourceSlices of {DRIVER} for nodes not in DRA mode: {n.name}"
        assert about(check(plane, {}), n.name) == [
            f"info {where} (left by a node moved back to the Device Plugin: the kubelet deletes"
            " them 30 s after the DRA plugin leaves; deploy-all.sh delete --dra removes them all)"
        ]
        (line,) = about(check(plane, {}, datetime.now(UTC) + LATER), n.name)
        assert line.startswith(f"PROBLEM {where} (1 slice(s), last written "), line
        assert line.endswith(
            " s ago, no DRA plugin there: the scheduler can allocate their devices to claims the"
            " node cannot prepare); fix: kubectl delete resourceslices --field-selector"
            f" spec.driver={DRIVER},spec.nodeName={n.name}"
        ), line


def test_verify_reads_a_broken_snapshot_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("workloads", "pods", "nodes", "configmaps", "deviceclasses"):
        (tmp_path / f"{name}.json").write_text('{"items": []}')
    (tmp_path / "resourceslices.json").write_text("{not json")
    code = cli.main(
        [
            "verify",
            "--dra",
            f"--snapshot={tmp_path}",
            f"--protocol={ROOT / 'deploy' / 'protocol.yaml'}",
            "--components=exporter",
        ]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert len(err) == 1, err
    assert err[0].startswith(f"error: cannot read {tmp_path / 'resourceslices.json'}: "), err
