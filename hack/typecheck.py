"""Run `mypy --strict` over every workspace member under its import name.

Members map their directory onto a namespaced import root with setuptools
`package-dir` (e.g. `DevicePlugin/` -> `lj_runtimekit.deviceplugin`, and
`cmd/device-plugin/` -> `...cmd.device_plugin`). mypy knows neither mapping
nor symlinked files, so this builds a tree of hard links laid out by import
name under .typecheck/ and checks that, reporting the original paths.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".typecheck"
SKIP_DIRS = {"build", "dist", "__pycache__", ".mypy_cache", ".pytest_cache"}


def members() -> list[Path]:
    """Workspace member directories from the root pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [ROOT / m for m in config["tool"]["uv"]["workspace"]["members"]]


def package_dirs(member: Path) -> dict[str, Path]:
    """Import name -> directory, most specific mapping last."""
    config = tomllib.loads((member / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: (member / rel).resolve() for name, rel in sorted(mapping.items())}


def link_tree(source: Path, target: Path, skip: set[Path]) -> dict[Path, Path]:
    """Hard-link every .py/.pyi/py.typed under `source` into `target`."""
    links: dict[Path, Path] = {}
    for dirpath, dirnames, filenames in os.walk(source):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and here / d not in skip]
        for name in filenames:
            if name.endswith((".py", ".pyi")) or name == "py.typed":
                dest = target / here.relative_to(source) / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.link(here / name, dest)
                links[dest] = here / name
    return links


def main() -> int:
    """Build the tree and run mypy on it; exit with mypy's status."""
    shutil.rmtree(TREE, ignore_errors=True)
    links: dict[Path, Path] = {}
    for member in members():
        mapping = package_dirs(member)
        for name, directory in mapping.items():
            nested = {d for n, d in mapping.items() if n != name and d.is_relative_to(directory)}
            links |= link_tree(directory, TREE / name.replace(".", "/"), nested)
    env = dict(os.environ, MYPYPATH=str(TREE))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--explicit-package-bases", str(TREE / "lj_runtimekit")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    by_tree = {str(k.relative_to(ROOT)): str(v.relative_to(ROOT)) for k, v in links.items()}
    for line in (result.stdout + result.stderr).splitlines():
        path, sep, rest = line.partition(":")
        print(f"{by_tree.get(path, path)}{sep}{rest}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
