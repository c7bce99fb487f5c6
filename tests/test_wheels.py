"""Every member's wheel installs into a fresh virtual environment and its console scripts run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
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
