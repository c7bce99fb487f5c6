"""Faults: the Runtime going away, slow or too old, the kubelet port closing, pods deleted.

The exporter keeps serving through all of them, says what is missing through its status
series, and recovers by itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess


@dataclass
class Live:
    """A simulator with two allocated pods, the kubelet, and an exporter collecting fast."""

    sim: SimulatorProcess
    kubelet: Any
    exporter: Any
    pods: list[Any]


@pytest.fixture
def live(lj: Any) -> Iterator[Live]:
    base = lj.short_dir()
    with SimulatorProcess(base / "s", EXAMPLE_NODES / "mig-8gpu.yaml") as sim:
        devices = lj.allocate(sim.socket_dir, [])
        pods = [
            lj.PodSpec("uid-1", "ns", "keep", ("c",), {}),
            lj.PodSpec("uid-2", "ns", "gone", ("c",), {}),
        ]
        grants = [
            lj.Grant(pods[0], "c", lj.DeviceShare(devices[0].id, 40, 40)),
            lj.Grant(pods[1], "c", lj.DeviceShare(devices[0].id, 20, 20)),
        ]
        lj.allocate(sim.socket_dir, grants)
        lj.annotate(grants, lj.PROTOCOL.annotations.allocated_devices)
        kubelet = lj.kubelet_pods(pods)
        exporter = lj.ExporterProcess(
            [
                "--runtime-socket-dir",
                str(sim.socket_dir),
                "--kubelet-pods-url",
                kubelet.url,
                "--collection-interval",
                "0.3",
                "--runtime-timeout",
                "1",
                "--kubelet-timeout",
                "1",
            ],
            base,
        )
        try:
            exporter.wait_scrape(
                "container series of both pods",
                lambda s: len(s.select("lj_runtimekit_container_utilization_ratio")) == 2,
            )
            yield Live(sim, kubelet, exporter, pods)
        finally:
            code = exporter.stop()
            kubelet.stop()
        assert code == 0, exporter.log()


def _errors(scrape: Any, source: str) -> float:
    return float(scrape.value("lj_runtimekit_exporter_collection_errors_total", source=source))


def test_runtime_down_still_serves_then_recovers(live: Live) -> None:
    exporter = live.exporter
    (up_info, _), *_ = exporter.scrape().select("lj_runtimekit_exporter_info")
    assert up_info["runtime_version"] == "v1.14.0"
    live.sim.restart_socket(down_ms=3000, wait=False)
    down = exporter.wait_scrape(
        "runtime_up 0", lambda s: s.value("lj_runtimekit_runtime_up") == 0, timeout=30
    )
    # Device, MIG and container series are absent (not stale-marked) while it is down.
    assert down.select("lj_runtimekit_device_utilization_ratio") == []
    assert down.select("lj_runtimekit_mig_utilization_ratio") == []
    assert down.select("lj_runtimekit_container_utilization_ratio") == []
    assert _errors(down, "runtime") >= 1
    assert down.value("lj_runtimekit_kubelet_up") == 1
    # One `_info` series whatever the Runtime does: the labels of the last read stay.
    assert [labels for labels, _ in down.select("lj_runtimekit_exporter_info")] == [up_info]
    status, body, _ = exporter.get("/healthz")
    assert status == 200, body
    back = exporter.wait_scrape(
        "runtime_up 1 again",
        lambda s: (
            s.value("lj_runtimekit_runtime_up") == 1
            and len(s.select("lj_runtimekit_container_utilization_ratio")) == 2
        ),
        timeout=40,
    )
    assert len(back.select("lj_runtimekit_device_utilization_ratio")) == 8
    log = exporter.log()
    assert "runtime unreadable" in log
    assert "runtime readable" in log
    assert "Traceback" not in log


def test_slow_runtime_never_delays_a_scrape(live: Live) -> None:
    exporter = live.exporter
    live.sim.set_latency(3000)  # every Runtime call now takes 3 s (timeout 1 s)
    try:
        exporter.wait_scrape(
            "runtime_up 0 from timeouts", lambda s: s.value("lj_runtimekit_runtime_up") == 0
        )
        worst = 0.0
        for _ in range(10):
            started = time.monotonic()
            exporter.scrape()
            worst = max(worst, time.monotonic() - started)
        assert worst < 1.0, f"a scrape took {worst:.3f} s while the Runtime was slow"
    finally:
        live.sim.set_latency(0)
    exporter.wait_scrape("runtime_up 1", lambda s: s.value("lj_runtimekit_runtime_up") == 1)


def test_kubelet_gone_keeps_device_series_and_drops_pod_labels(live: Live) -> None:
    exporter = live.exporter
    # A deleted pod's series disappear at the next collection; the other pod's stay.
    live.kubelet.replace(p.as_json() for p in live.pods[:1])
    after = exporter.wait_scrape(
        "the deleted pod's series to go",
        lambda s: s.select("lj_runtimekit_container_utilization_ratio", pod="gone") == [],
    )
    assert len(after.select("lj_runtimekit_container_utilization_ratio", pod="keep")) == 1
    assert after.value("lj_runtimekit_device_core_allocated_ratio", device="0") == 0.4

    live.kubelet.stop()
    down = exporter.wait_scrape(
        "kubelet_up 0", lambda s: s.value("lj_runtimekit_kubelet_up") == 0, timeout=30
    )
    assert down.select("lj_runtimekit_container_utilization_ratio") == []
    assert down.select("lj_runtimekit_device_core_allocated_ratio") == []
    assert down.select("lj_runtimekit_exporter_pods") == []
    assert len(down.select("lj_runtimekit_device_utilization_ratio")) == 8
    assert down.value("lj_runtimekit_runtime_up") == 1
    first = _errors(down, "kubelet")
    assert first >= 1
    exporter.wait_scrape(
        "the kubelet error counter to rise", lambda s: _errors(s, "kubelet") > first
    )
    assert "kubelet pods unreadable" in exporter.log()


def test_feature_gates_follow_the_runtime_version(live: Live) -> None:
    exporter = live.exporter
    live.sim.set_version("v1.13.0")
    old = exporter.wait_scrape(
        "container metrics gated off",
        lambda s: s.value("lj_runtimekit_feature_enabled", feature="container-metrics") == 0,
    )
    assert old.select("lj_runtimekit_container_utilization_ratio") == []
    assert old.select("lj_runtimekit_mig_utilization_ratio") == []
    assert len(old.select("lj_runtimekit_device_utilization_ratio")) == 8
    # Allocation still comes from the pods' annotations.
    assert old.value("lj_runtimekit_container_core_allocated_ratio", pod="keep") == 0.4
    info = old.select("lj_runtimekit_exporter_info")[0][0]
    assert (info["runtime_version"], info["features"]) == ("v1.13.0", "")

    live.sim.set_version("v1.12.0")  # below the base minimum: nothing is vouched for
    exporter.wait_scrape("runtime_up 0", lambda s: s.value("lj_runtimekit_runtime_up") == 0)
    assert "too old" in exporter.log()

    live.sim.set_version("v1.14.0")
    exporter.wait_scrape(
        "container metrics back",
        lambda s: len(s.select("lj_runtimekit_container_utilization_ratio")) == 2,
    )


def test_xid_errors_carry_the_xid_code(live: Live) -> None:
    """An XID fault is counted under the code the Runtime names in the health reason; the
    codes of a device add up to the Runtime's counter; other faults count none."""
    exporter = live.exporter
    devices = exporter.scrape().select("lj_runtimekit_device_info")
    uuid = {labels["device"]: labels["uuid"] for labels, _ in devices}

    def xids(s: Any, device: str) -> dict[str, float]:
        found = s.select("lj_runtimekit_device_xid_errors_total", device=device)
        return {labels["xid"]: value for labels, value in found}

    assert xids(exporter.scrape(), "2") == {"": 0}
    live.sim.set_health(uuid["2"], healthy=False, reason="XID 79")
    exporter.wait_scrape("XID 79 on device 2", lambda s: xids(s, "2") == {"": 0, "79": 1})
    live.sim.set_health(uuid["2"], healthy=True)
    live.sim.set_health(uuid["2"], healthy=False, reason="XID 48")
    live.sim.set_health(uuid["3"], healthy=False, reason="ECC double-bit error")
    after = exporter.wait_scrape(
        "XID 48 on device 2, device 3 unhealthy",
        lambda s: (
            xids(s, "2") == {"": 0, "48": 1, "79": 1}
            and s.value("lj_runtimekit_device_healthy", device="3") == 0
        ),
    )
    assert xids(after, "3") == {"": 0}
    assert xids(after, "0") == {"": 0}
