"""Protocol constants: defaults, overrides and every kind of bad file."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit.proto.pkg.protocol import DEFAULTS, ProtocolError, load_protocol


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


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_protocol(write(tmp_path, "")).as_flat() == dict(DEFAULTS)


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
    ],
)
def test_bad_files_name_key_and_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProtocolError) as excinfo:
        load_protocol(path)
    assert str(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ProtocolError, match=r"nope\.yaml: cannot read protocol file"):
        load_protocol(missing)
