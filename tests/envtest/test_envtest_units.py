"""Pure logic of the envtest harness (no control plane needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lj_runtimekit.envtest import (
    DRA_GATES,
    DRA_VERSION,
    GROUP_LABEL,
    GpuNodeSpec,
    ProtocolNames,
    Taint,
    ToolsMissingError,
    dra_gates,
    failure_annotations,
    find_tools,
    gpu_node_manifest,
    load_versions,
)
from lj_runtimekit.envtest import kwok as kwok_mod
from lj_runtimekit.envtest.versions import bin_dir, minor, parse_versions_env


def test_versions_env_is_pinned() -> None:
    versions = load_versions()
    assert versions.k8s.startswith("v1.")
    assert versions.etcd.startswith("v3.6.")
    assert versions.kwok.startswith("v0.")
    assert versions.helm.startswith("v3.")


def test_dra_version_is_pinned_where_the_dra_parts_are_on_by_default() -> None:
    assert load_versions().k8s_dra == DRA_VERSION
    assert minor(DRA_VERSION) >= 36
    assert dra_gates(DRA_VERSION) == {}
    assert dra_gates("v1.34.4") == dra_gates("v1.35.0") == DRA_GATES


def test_dra_version_override_and_bin_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LJ_RUNTIMEKIT_CACHE", str(tmp_path))
    monkeypatch.setenv("K8S_VERSION", "v1.34.4")
    monkeypatch.setenv("K8S_DRA_VERSION", "v1.36.3")
    assert load_versions().k8s_dra == "v1.36.3"
    assert bin_dir() == tmp_path / "k8s" / "v1.34.4" / "bin"
    assert bin_dir("v1.36.3") == tmp_path / "k8s" / "v1.36.3" / "bin"
    # LJ_RUNTIMEKIT_K8S_BIN stands for the pinned K8S_VERSION's directory only.
    monkeypatch.setenv("LJ_RUNTIMEKIT_K8S_BIN", str(tmp_path / "mine"))
    assert bin_dir() == bin_dir("v1.34.4") == tmp_path / "mine"
    assert bin_dir("v1.36.3") == tmp_path / "k8s" / "v1.36.3" / "bin"
    with pytest.raises(ToolsMissingError, match=r"v1\.36\.3"):
        find_tools(k8s="v1.36.3")


def test_parse_versions_env_rejects_garbage() -> None:
    assert parse_versions_env("# c\n\nA=1\n") == {"A": "1"}
    with pytest.raises(ValueError, match="line 2"):
        parse_versions_env("A=1\nnot a line\n")


def test_missing_tools_name_make_k8s_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LJ_RUNTIMEKIT_K8S_BIN", str(tmp_path))
    with pytest.raises(ToolsMissingError, match="make k8s-tools"):
        find_tools()


def test_gpu_node_manifest() -> None:
    spec = GpuNodeSpec(
        name="n1",
        gpus=2,
        taints=[Taint("lingjun.com/dedicated", value="x")],
        topology_block="b1",
        labels={"extra": "1"},
    )
    node = gpu_node_manifest(spec, group="g")
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    labels = node["metadata"]["labels"]
    assert labels["lj_runtimekit_enable"] == "true"
    assert labels["lingjun.com/topology-block"] == "b1"
    assert labels[GROUP_LABEL] == "g"
    assert labels["extra"] == "1"
    assert node["status"]["allocatable"]["alibabacloud.com/gpu"] == "2"
    assert node["status"]["capacity"]["alibabacloud.com/gpu-core.percentage"] == "200"
    assert node["status"]["capacity"]["alibabacloud.com/gpu-memory.percentage"] == "200"
    assert node["spec"]["taints"] == [
        {"key": "lingjun.com/dedicated", "effect": "NoSchedule", "value": "x"}
    ]


def test_gpu_node_manifest_other_protocol_names() -> None:
    names = ProtocolNames(gpu="example.com/gpu", enable_label="example/enable")
    node = gpu_node_manifest(GpuNodeSpec(name="n2", gpus=1), names)
    assert node["status"]["allocatable"]["example.com/gpu"] == "1"
    assert node["metadata"]["labels"]["example/enable"] == "true"


def test_cpu_node_has_no_gpu_resources_or_device_labels() -> None:
    node = gpu_node_manifest(GpuNodeSpec(name="n3", gpus=0, enable=False))
    assert "alibabacloud.com/gpu" not in node["status"]["allocatable"]
    assert "lingjun.com/device-count" not in node["metadata"]["labels"]
    assert "lj_runtimekit_enable" not in node["metadata"]["labels"]


@pytest.mark.parametrize("name", ["", "UPPER", "-x", "a_b"])
def test_bad_node_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="DNS subdomain"):
        GpuNodeSpec(name=name)


def test_failure_annotations() -> None:
    assert failure_annotations(3, "boom") == {
        "envtest.lj-runtimekit.io/exit-code": "3",
        "envtest.lj-runtimekit.io/reason": "Error",
        "envtest.lj-runtimekit.io/message": "boom",
    }
    with pytest.raises(ValueError, match=r"1\.\.255"):
        failure_annotations(0, "boom")
    with pytest.raises(ValueError, match="message"):
        failure_annotations(1, "")


def test_kwok_stages_named_keeps_the_node_stages_and_only_the_named_pod_stages() -> None:
    only = list(yaml.safe_load_all(kwok_mod.stages_named("pod-delete", "pod-ready")))
    assert [s["metadata"]["name"] for s in only] == [
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-delete",
    ]
    full = {s["metadata"]["name"]: s for s in yaml.safe_load_all(kwok_mod.stages_text())}
    assert only == [full[s["metadata"]["name"]] for s in only]
    with pytest.raises(ValueError, match="pod-sleep"):
        kwok_mod.stages_named("pod-delete", "pod-sleep")


def test_kwok_stages_parse_and_use_the_documented_annotations() -> None:
    stages = list(yaml.safe_load_all(kwok_mod.stages_text()))
    assert [s["metadata"]["name"] for s in stages] == [
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-complete",
        "pod-fail",
        "pod-delete",
    ]
    assert all(s["kind"] == "Stage" for s in stages)
    assert [s["spec"]["resourceRef"]["kind"] for s in stages[:2]] == ["Node", "Node"]
    text = kwok_mod.stages_text()
    for key in (
        kwok_mod.FAIL_EXIT_CODE_ANNOTATION,
        kwok_mod.FAIL_REASON_ANNOTATION,
        kwok_mod.FAIL_MESSAGE_ANNOTATION,
    ):
        assert key in text


def test_protocol_names_match_the_contract_package_defaults() -> None:
    protocol_mod = pytest.importorskip("lj_runtimekit.proto.pkg.protocol")
    assert ProtocolNames.from_protocol(protocol_mod.load_protocol()) == ProtocolNames()
