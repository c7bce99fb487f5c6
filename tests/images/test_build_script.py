"""deploy/docker/build.sh and hack/base-image.sh operator mistakes: one clear line naming the
variable or argument, before anything is built."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "docker" / "build.sh"
BASE = ROOT / "hack" / "base-image.sh"
MISSING = "/nonexistent/lj-runtimekit"


def _run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["kubelet"],
            {},
            "unknown component 'kubelet'; known: device-plugin, scheduler-framework, exporter, "
            "controller",
        ),
        (["exporter"], {"BUILDER": "podman"}, "BUILDER is 'podman'; expected docker or buildah"),
        (
            ["exporter"],
            {"BUILDER": "docker", "DOCKER": f"{MISSING}/docker"},
            f"BUILDER=docker: '{MISSING}/docker' not found",
        ),
        (
            ["exporter"],
            {"BUILDER": "buildah", "BUILDAH": f"{MISSING}/buildah"},
            f"BUILDER=buildah: '{MISSING}/buildah' not found: make deps installs it",
        ),
        (
            ["exporter"],
            {"DOCKER": f"{MISSING}/docker", "BUILDAH": f"{MISSING}/buildah"},
            f"no Docker engine answers ('{MISSING}/docker info') and '{MISSING}/buildah' is not "
            "installed",
        ),
    ],
    ids=["component", "builder", "docker", "buildah", "neither"],
)
def test_build_sh_mistakes(args: list[str], env: dict[str, str], message: str) -> None:
    result = _run(BUILD, *args, **env)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("docker/build.sh: error: ")
    assert message in line
    assert "building" not in result.stdout


def test_base_image_without_buildah() -> None:
    result = _run(BASE, BUILDAH=f"{MISSING}/buildah")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"base-image.sh: error: '{MISSING}/buildah' not found: make deps installs it "
        "(Debian package buildah)"
    ]
    assert result.stdout == ""
