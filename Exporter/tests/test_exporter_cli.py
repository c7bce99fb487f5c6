"""Operator mistakes on the command line: one clear line naming the flag, exit status 1."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit.proto.pkg import protocolinfo
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess


def _one_error_line(result: Any, *needles: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line: str = lines[0]
    assert line.startswith("lj-exporter: error: "), line
    for needle in needles:
        assert needle in line, line
    return line


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--collection-interval", "0"], ["--collection-interval", "positive"]),
        (["--collection-interval", "soon"], ["--collection-interval", "'soon'"]),
        (["--port", "70000"], ["--port", "0..65535"]),
        (["--kubelet-pods-url", "10255/pods"], ["--kubelet-pods-url", "http://"]),
        (["--kubelet-pods-url", "http:///pods"], ["--kubelet-pods-url", "no host"]),
        (
            ["--kubelet-pods-url", "", "--apiserver-fallback", "off"],
            ["--kubelet-pods-url", "kubelet not used", "API server"],
        ),
        (["--log-level", "LOUD"], ["--log-level"]),
        (["--no-such-flag"], ["--no-such-flag"]),
    ],
)
def test_bad_flags(lj: Any, args: list[str], needles: list[str]) -> None:
    _one_error_line(lj.run_exporter_cli(*args), *needles)


def test_bad_environment_variable_names_the_flag(lj: Any) -> None:
    result = lj.run_exporter_cli(env={"LJ_EXPORTER_PORT": "nine"})
    _one_error_line(result, "--port", "'nine'")


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ("resources.gpu: alibabacloud.com/gpu\nresources.gpux: a.com/b\n", ["'resources.gpux'"]),
        ("resources.core: 'no slash'\n", ["'resources.core'", "extended resource"]),
        ("annotations.allocated_devices: ''\n", ["'annotations.allocated_devices'", "empty"]),
        ("[unclosed\n", ["not valid YAML"]),
    ],
)
def test_bad_protocol_file(lj: Any, tmp_path: Path, content: str, needles: list[str]) -> None:
    path = tmp_path / "protocol.yaml"
    path.write_text(content)
    line = _one_error_line(
        lj.run_exporter_cli("--protocol-file", str(path)), "--protocol-file", *needles
    )
    assert str(path) in line


def test_missing_protocol_file(lj: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    _one_error_line(
        lj.run_exporter_cli("--protocol-file", str(missing)), str(missing), "cannot read"
    )


def test_port_in_use(lj: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = lj.run_exporter_cli("--listen-address", "127.0.0.1", "--port", str(port))
    _one_error_line(result, f"127.0.0.1:{port}", "cannot listen")


def test_version(lj: Any) -> None:
    result = lj.run_exporter_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("lj-exporter v1.")


def test_custom_protocol_names_are_used(lj: Any, tmp_path: Path) -> None:
    """A protocol file renaming the annotation and the resource: the exporter uses the new names
    and reports that file's hash."""
    protocol = tmp_path / "protocol.yaml"
    protocol.write_text(
        "annotations.allocated_devices: example.com/given-devices\n"
        "resources.gpu: example.com/accelerator\n"
    )
    base = lj.short_dir()
    with SimulatorProcess(base / "s", EXAMPLE_NODES / "tdm-8gpu.yaml") as sim:
        devices = lj.allocate(sim.socket_dir, [])
        pod = lj.PodSpec("uid-p", "ns", "p", ("c",), {})
        lj.annotate(
            [lj.Grant(pod, "c", lj.DeviceShare(devices[3].id, 10, 20))],
            "example.com/given-devices",
        )
        kubelet = lj.kubelet_pods([pod])
        exporter = lj.ExporterProcess(
            [
                "--runtime-socket-dir",
                str(sim.socket_dir),
                "--kubelet-pods-url",
                kubelet.url,
                "--protocol-file",
                str(protocol),
            ],
            base,
        )
        try:
            scrape = exporter.wait_scrape(
                "allocation from the renamed annotation",
                lambda s: bool(s.select("lj_runtimekit_device_core_allocated_ratio")),
            )
            assert scrape.value("lj_runtimekit_device_core_allocated_ratio", device="3") == 0.1
            assert scrape.value("lj_runtimekit_device_memory_allocated_ratio", device="3") == 0.2
            info = scrape.select("lj_runtimekit_device_info", device="3")[0][0]
            assert info["resource"] == "example.com/accelerator"
            sha = protocolinfo.protocol_sha256(load_protocol(protocol))
            assert scrape.select(protocolinfo.METRIC) == [({"sha256": sha}, 1.0)]
        finally:
            assert exporter.stop() == 0
            kubelet.stop()
