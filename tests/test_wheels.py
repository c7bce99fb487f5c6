"""Every member's wheel installs into a fresh virtual environment and its console scripts run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _members() -> list[Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [ROOT / m for m in config["tool"]["uv"]["workspace"]["members"]]


def _uv() -> list[str]:
    uv = shutil.which("uv")
    return [uv] if uv else [sys.executable, "-m", "uv"]


def _run(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with every member's wheel installed."""
    work = tmp_path_factory.mktemp("wheels")
    dist = work / "dist"
    for member in _members():
        _run([*_uv(), "build", "--quiet", "--wheel", "--out-dir", str(dist), str(member)])
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == len(_members())
    env = work / "venv"
    _run([*_uv(), "venv", "--quiet", "--python", sys.executable, str(env)])
    _run(
        [
            *_uv(),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(env / "bin" / "python"),
            *map(str, wheels),
        ]
    )
    return env


def _scripts() -> list[tuple[str, str]]:
    found = []
    for member in _members():
        project = tomllib.loads((member / "pyproject.toml").read_text())["project"]
        found += [(project["name"], script) for script in project.get("scripts", {})]
    return found


@pytest.mark.parametrize(("distribution", "script"), _scripts())
def test_console_script_help(venv: Path, distribution: str, script: str) -> None:
    result = _run([str(venv / "bin" / script), "--help"], cwd=venv)
    assert "usage" in result.stdout.lower(), f"{script} from {distribution}: {result.stdout}"


def test_wheels_do_not_ship_tests_or_build_trees(venv: Path) -> None:
    site = next((venv / "lib").glob("python3*/site-packages"))
    root = site / "lj_runtimekit"
    assert (root / "proto" / "lingjun" / "runtime" / "v1" / "runtime_pb2.py").exists()
    assert not list(root.rglob("tests")), "tests must not be packaged"
    assert not list(root.rglob("__editable__*"))


TEST_TOOLING = ("testkit", "runtimesim", "envtest", "sandbox")
"""Import roots (under lj_runtimekit/) and distributions that only tests and the sandbox use."""


def _image_members() -> set[str]:
    """The member directories whose wheels a component image installs (its Dockerfile)."""
    found: set[str] = set()
    for dockerfile in (ROOT / "deploy" / "docker").glob("*.Dockerfile"):
        found |= set(
            re.findall(r"uv build --wheel --out-dir /wheels (\S+)", dockerfile.read_text())
        )
    return found


def test_image_wheels_carry_no_test_tooling(venv: Path) -> None:
    members = _image_members()
    assert members >= {"proto", "DevicePlugin", "SchedulerFramework", "Exporter", "Controller"}
    names = {
        m: tomllib.loads((ROOT / m / "pyproject.toml").read_text())["project"]["name"]
        for m in members
    }
    for member, name in names.items():
        (wheel,) = (venv.parent / "dist").glob(f"{name.replace('-', '_')}-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            files = archive.namelist()
            metadata = next(archive.read(f).decode() for f in files if f.endswith("/METADATA"))
        tooling = [f for f in files if f.split("/")[1:2] and f.split("/")[1] in TEST_TOOLING]
        assert not tooling, f"{member}'s wheel ships test tooling: {tooling[:5]}"
        requires = re.findall(r"^Requires-Dist: (\S+)", metadata, re.MULTILINE)
        assert not [
            r for r in requires if r.startswith(tuple(f"lj-runtimekit-{t}" for t in TEST_TOOLING))
        ], f"{member}'s wheel requires test tooling: {requires}"
