"""Label names: dcgm-exporter's names on request, allow-listed pod labels and the pod UID
on the container series, and the flags' mistakes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

APP = "app.kubernetes.io/name"


@contextlib.contextmanager
def _scraped(lj: Any, extra: list[str]) -> Iterator[Any]:
    """The first scrape with both containers of an exporter over a MIG node running a
    whole-GPU pod and a MIG pod, started with the flags `extra`."""
    base = lj.short_dir()
    with (
        SimulatorProcess(base / "s", EXAMPLE_NODES / "mig-8gpu.yaml") as sim,
        contextlib.ExitStack() as stack,
    ):
        devices = lj.allocate(sim.socket_dir, [])
        mig = devices[7].mig_instances[0]
        labels = {APP: "trainer", "team": "a"}
        train = lj.PodSpec("uid-t", "ns", "train", ("main",), {}, labels=labels)
        infer = lj.PodSpec("uid-i", "ns", "infer", ("main",), {}, labels={APP: "server"})
        grants = [
            lj.Grant(train, "main", lj.DeviceShare(devices[0].id)),
            lj.Grant(infer, "main", lj.DeviceShare(mig.id)),
        ]
        lj.allocate(sim.socket_dir, grants)
        lj.annotate(grants, lj.PROTOCOL.annotations.allocated_devices)
        kubelet = lj.kubelet_pods([train, infer])
        stack.callback(kubelet.stop)
        args = ["--runtime-socket-dir", str(sim.socket_dir), "--kubelet-pods-url", kubelet.url]
        exporter = lj.ExporterProcess([*args, *extra], base)
        try:
            yield exporter.wait_scrape(
                "the container series",
                lambda s: len(s.select("lj_runtimekit_container_utilization_ratio")) == 2,
            )
        finally:
            assert exporter.stop() == 0


def test_dcgm_label_names_and_pod_labels(lj: Any) -> None:
    flags = ["--dcgm-label-names", "true", "--pod-labels", f"{APP}, team", "--pod-uid-label", "1"]
    with _scraped(lj, flags) as scrape:
        device = scrape.select("lj_runtimekit_device_memory_total_bytes", gpu="0")
        assert len(device) == 1
        labels, _ = device[0]
        assert set(labels) == {"Hostname", "gpu", "UUID", "modelName", "kind"}
        assert labels["Hostname"] == "node-a"
        (info, _), *_ = scrape.select("lj_runtimekit_device_info", gpu="0")
        assert "pci_bus_id" in info
        (mig, _), *_ = scrape.select("lj_runtimekit_mig_memory_total_bytes")
        assert {"GPU_I_PROFILE", "GPU_I_ID", "gpu"} <= set(mig)
        assert scrape.value("lj_runtimekit_runtime_up", Hostname="node-a") == 1
        ((train, _),) = scrape.select("lj_runtimekit_container_utilization_ratio", pod="train")
        assert train["label_app_kubernetes_io_name"] == "trainer"
        assert train["label_team"] == "a"
        assert train["pod_uid"] == "uid-t"
        assert (train["namespace"], train["container"], train["gpu"]) == ("ns", "main", "0")
        ((infer, _),) = scrape.select("lj_runtimekit_container_core_allocated_ratio", pod="infer")
        assert infer["label_app_kubernetes_io_name"] == "server"
        assert infer["label_team"] == ""
        assert infer["pod_uid"] == "uid-i"
        ((instance, _),) = scrape.select(
            "lj_runtimekit_mig_info", gpu=infer["gpu"], GPU_I_ID=infer["GPU_I_ID"]
        )
        assert infer["GPU_I_PROFILE"] == instance["GPU_I_PROFILE"] != ""
        assert not [n for n, lab, _ in scrape.samples if {"node", "device", "uuid"} & set(lab)]


def test_default_label_names_carry_no_pod_labels(lj: Any) -> None:
    with _scraped(lj, []) as scrape:
        ((train, _),) = scrape.select("lj_runtimekit_container_utilization_ratio", pod="train")
        assert set(train) == {
            "node",
            "namespace",
            "pod",
            "container",
            "device",
            "uuid",
            "mig_profile",
            "mig_instance_id",
        }


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--pod-labels", "team,bad key"], ["--pod-labels", "'bad key'", "label key"]),
        (["--pod-labels", "a.b,a_b"], ["--pod-labels", "'a.b'", "'a_b'", "label_a_b"]),
        (["--dcgm-label-names", "maybe"], ["--dcgm-label-names", "'maybe'"]),
    ],
)
def test_label_flag_mistakes(lj: Any, args: list[str], needles: list[str]) -> None:
    result = lj.run_exporter_cli(*args)
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("lj-exporter: error: ")
    for needle in needles:
        assert needle in line, line
