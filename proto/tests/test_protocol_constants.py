"""Protocol constants: defaults, overrides and every kind of bad file."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit.proto.pkg.protocol import (
    DEFAULTS,
    ProtocolError,
    load_protocol,
    parse_protocol_text,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "protocol.yaml"
    path.write_text(text)
    return path


def test_defaults_match_design() -> None:
    protocol = load_protocol()
    assert protocol.resources.gpu == "alibabacloud.com/gpu"
    assert protocol.resources.core == "alibabacloud.com/gpu-core.percentage"
    assert protocol.resources.memory == "alibabacloud.com/gpu-memory.percentage"
    assert protocol.resources.mig("1g.18gb") == "alibabacloud.com/mig-1g.18gb"
    assert protocol.labels.enable == "lj_runtimekit_enable"
    assert protocol.as_flat() == dict(DEFAULTS)


def test_override_changes_only_given_keys(tmp_path: Path) -> None:
    path = write(tmp_path, 'resources.gpu: "example.com/gpu"\nresources.mig_prefix: example.com\n')
    protocol = load_protocol(path)
    assert protocol.resources.gpu == "example.com/gpu"
    assert protocol.resources.mig("2g.20gb") == "example.com/mig-2g.20gb"
    assert protocol.resources.mig_profile("example.com/mig-2g.20gb") == "2g.20gb"
    assert protocol.resources.mig_profile("alibabacloud.com/gpu") is None
    assert protocol.resources.core == DEFAULTS["resources.core"]
    assert protocol.source == str(path)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "{}\n"])
def test_an_empty_file_is_refused_not_the_defaults(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProtocolError) as excinfo:
        load_protocol(path)
    assert str(excinfo.value) == (
        f"{path}: the protocol file has no keys; give the keys it changes"
        " (deploy/protocol.yaml lists every one), or no file for the built-in names"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("resources.gpuu: a.com/gpu\n", "unknown key 'resources.gpuu'"),
        ('resources.gpu: ""\n', "key 'resources.gpu' has an empty value"),
        ("resources.gpu:\n", "key 'resources.gpu' has an empty value"),
        ("resources.gpu: 3\n", "key 'resources.gpu' must be a string"),
        ("resources.gpu: gpu\n", "key 'resources.gpu': 'gpu' is not a valid extended resource"),
        ("resources.core: Example.com/x\n", "key 'resources.core': 'Example.com/x'"),
        ("resources.memory: kubernetes.io/gpu\n", "kubernetes.io domain is reserved"),
        ("resources.gpu: a.com/-bad\n", "key 'resources.gpu'"),
        (f"resources.gpu: a.com/{'x' * 64}\n", "at most 63 characters"),
        ("resources.mig_prefix: a.com/b\n", "key 'resources.mig_prefix'"),
        ("labels.enable: 'bad key!'\n", "key 'labels.enable'"),
        ("- a\n- b\n", "expected a mapping"),
        ("resources.gpu: [\n", "not valid YAML"),
        (
            "resources.gpu: a.com/gpu\nlabels.enable: x\nresources.gpu: b.com/gpu\n",
            "key 'resources.gpu' is given twice (lines 1 and 3); keep one",
        ),
        (
            f"resources.gpu: {DEFAULTS['resources.core']}\n",
            "keys 'resources.gpu' and 'resources.core' both name"
            f" {DEFAULTS['resources.core']!r}; each needs its own",
        ),
        (
            f"annotations.bind_phase: {DEFAULTS['annotations.assigned_devices']}\n",
            "keys 'annotations.assigned_devices' and 'annotations.bind_phase' both name"
            f" {DEFAULTS['annotations.assigned_devices']!r}; each needs its own",
        ),
        (
            "labels.device_kind: a.com/k\nlabels.device_mode: a.com/k\n",
            "keys 'labels.device_kind' and 'labels.device_mode' both name 'a.com/k'",
        ),
        (
            "resources.ppu: alibabacloud.com/mig-1g.10gb\n",
            "key 'resources.ppu': 'alibabacloud.com/mig-1g.10gb' is a MIG resource name"
            " (resources.mig_prefix alibabacloud.com + /mig-<profile>)",
        ),
    ],
)
def test_bad_files_name_key_and_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProtocolError) as excinfo:
        load_protocol(path)
    assert str(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_the_same_name_in_different_groups_is_allowed(tmp_path: Path) -> None:
    # A label and an annotation are separate maps: one key in each does not collide.
    path = write(tmp_path, f"labels.device_kind: {DEFAULTS['annotations.gpu_policy']}\n")
    assert load_protocol(path).labels.device_kind == DEFAULTS["annotations.gpu_policy"]


def test_configmap_text_goes_through_the_same_checks() -> None:
    where = "ConfigMap ns/cm key protocol.yaml"
    with pytest.raises(ProtocolError, match=r"^ConfigMap ns/cm key protocol.yaml: key 'labels"):
        parse_protocol_text("labels.enable: a\nlabels.enable: b\n", where)
    with pytest.raises(ProtocolError, match="has no keys"):
        parse_protocol_text("", where)
    assert parse_protocol_text("labels.enable: a\n", where).source == where


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ProtocolError, match=r"nope\.yaml: cannot read protocol file"):
        load_protocol(missing)
