"""hack/download-deps.sh: switching the Kubernetes version (pin + lock), bad versions."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "download-deps.sh"
OLDEST_VERSION = "v1.28.0"  # the oldest supported release, as hack/versions.env names it

_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "bench",
)


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(cwd / "hack" / "download-deps.sh"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    if shutil.which("go") is None or shutil.which("uv") is None:
        pytest.fail("download-deps.sh needs go and uv on PATH (make deps)")
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=_IGNORE, symlinks=True)
    return copy


def test_oldest_version_is_the_one_versions_env_names() -> None:
    assert f"K8S_OLDEST_VERSION={OLDEST_VERSION}\n" in (ROOT / "hack" / "versions.env").read_text()


def test_switch_to_the_oldest_version_pins_client_and_refreshes_lock(repo_copy: Path) -> None:
    result = run(["--skip-tools", OLDEST_VERSION], repo_copy)

    assert result.returncode == 0, result.stdout + result.stderr
    versions = (repo_copy / "hack" / "versions.env").read_text()
    assert f"K8S_VERSION={OLDEST_VERSION}\n" in versions
    pyproject = (repo_copy / "hack" / "envtest" / "pyproject.toml").read_text()
    assert '"kubernetes>=28,<29"' in pyproject
    # No member keeps the old pin.
    for member in repo_copy.glob("**/pyproject.toml"):
        assert '"kubernetes>=34,<35"' not in member.read_text(), member
    lock = (repo_copy / "uv.lock").read_text()
    match = re.search(r'name = "kubernetes"\nversion = "([^"]+)"', lock)
    assert match is not None
    assert match.group(1).startswith("28.")
    # The real repository is untouched.
    assert '"kubernetes>=34,<35"' in (ROOT / "hack" / "envtest" / "pyproject.toml").read_text()


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("1.34", "malformed Kubernetes version"),
        ("v1.34.x", "malformed Kubernetes version"),
        ("v2.0.0", "malformed Kubernetes version"),
        ("v1.99.0", "unknown Kubernetes version v1.99.0"),
        ("v1.27.16", "too old: the oldest supported is 1.28"),
    ],
)
def test_bad_versions_are_refused_without_changes(
    repo_copy: Path, version: str, message: str
) -> None:
    before = (repo_copy / "hack" / "versions.env").read_text()

    result = run([version], repo_copy)

    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert (repo_copy / "hack" / "versions.env").read_text() == before
