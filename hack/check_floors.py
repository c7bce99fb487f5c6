"""Check the dependency floors: resolve the workspace with the declared minimum of every
direct dependency (uv's lowest-direct resolution; indirect ones at their highest), install
it into its own virtual environment and run the unit tests there.

Works on a temporary copy of the working tree (tracked and untracked files git does not
ignore), so the real uv.lock and .venv are never touched. Also fails when a declared floor
is not the version resolved (another requirement raises it, so the floor is never tested):
members declaring the same dependency declare the same floor, the one that gets tested.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "3.11"
UNIT_MARKERS = "not controlplane and not e2e and not images"


@dataclass(frozen=True)
class Floor:
    """One `name>=floor` requirement of a workspace member, the versions resolved for it and
    the highest floor any member declares for it."""

    member: str
    name: str
    floor: str
    resolved: tuple[str, ...]
    highest: str

    def problem(self) -> str | None:
        """Why the floor is not the version tested, or None when it is: every resolved
        version is the floor's release (`34` matches `34.1.0`, the first 34.x)."""
        if older(self.floor, self.highest):
            return f"another member declares >={self.highest}"
        want = release(self.floor)
        if any(release(v)[: len(want)] != want for v in self.resolved):
            return f"resolves to {', '.join(self.resolved)}: another requirement raises it"
        return None


def release(version: str) -> tuple[int, ...]:
    """The leading numeric components of a version: `1.85.1rc1` -> (1, 85, 1)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def older(a: str, b: str) -> bool:
    """Whether release `a` comes before release `b` (`6` and `6.0` are the same)."""
    width = max(len(release(a)), len(release(b)))
    pad = (0,) * width
    return (release(a) + pad)[:width] < (release(b) + pad)[:width]


def log(message: str) -> None:
    """One progress line, timestamped like the other hack scripts."""
    print(f"[check-floors {time.strftime('%H:%M:%S')}] {message}", flush=True)


def uv() -> list[str]:
    """The uv command: the binary on PATH, else the Python module."""
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def copy_tree(dest: Path) -> None:
    """Copy the working tree's files (not ignored ones, not uv.lock) into `dest`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in sorted(set(listed.stdout.decode().split("\0")) - {"", "uv.lock"}):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def floors(lock: dict[str, Any]) -> list[Floor]:
    """Every `>=` requirement of a workspace member (dev group included) in `lock`."""
    versions: dict[str, list[str]] = {}
    members = []
    for package in lock["package"]:
        if "editable" in package["source"] or "virtual" in package["source"]:
            members.append(package)
        else:
            versions.setdefault(package["name"], []).append(package["version"])
    found = []
    for member in members:
        metadata = member.get("metadata", {})
        requirements = list(metadata.get("requires-dist", []))
        for group in metadata.get("requires-dev", {}).values():
            requirements += group
        for requirement in requirements:
            for spec in requirement.get("specifier", "").split(","):
                if spec.strip().startswith(">="):
                    found.append((member["name"], requirement["name"], spec.strip()[2:]))
    highest: dict[str, str] = {}
    for _, name, floor in found:
        if older(highest.get(name, "0"), floor):
            highest[name] = floor
    return [
        Floor(member, name, floor, tuple(versions.get(name, [])), highest[name])
        for member, name, floor in sorted(found, key=lambda f: (f[1], f[0]))
    ]


def uv_step(argv: list[str], work: Path, env: dict[str, str]) -> None:
    """Run one uv command in the copy; exit 1 (uv printed why) when it fails."""
    if subprocess.run([*uv(), *argv], cwd=work, env=env, check=False).returncode:
        log(f"uv {argv[0]} failed at the floors")
        sys.exit(1)


def main() -> int:
    """Lock at the floors, report them, install, run the unit tests; 0 when all hold."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="pytest-xdist processes")
    parser.add_argument("paths", nargs="*", help="test paths (default: every testpath)")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lj-floors-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        env["UV_PROJECT_ENVIRONMENT"] = str(work / ".venv")
        log(f"copying the working tree into {work}")
        copy_tree(work)
        log("resolving every direct dependency at its floor (uv lock --resolution lowest-direct)")
        uv_step(["lock", "--quiet", "--python", PYTHON, "--resolution", "lowest-direct"], work, env)
        found = floors(tomllib.loads((work / "uv.lock").read_text()))
        for floor in found:
            mark = "ok" if floor.problem() is None else "NOT THE FLOOR"
            resolved = ", ".join(floor.resolved)
            log(f"  {floor.name}>={floor.floor} ({floor.member}): {resolved} {mark}")
        raised = [f for f in found if f.problem() is not None]
        log(f"installing into {env['UV_PROJECT_ENVIRONMENT']}")
        uv_step(["sync", "--frozen", "--quiet", "--python", PYTHON], work, env)
        log(f"unit tests at the floors ({args.workers} processes)")
        pytest_argv = ["run", "--frozen", "--no-sync", "pytest", "-q", "-m", UNIT_MARKERS]
        tests = subprocess.run(
            [*uv(), *pytest_argv, f"--numprocesses={args.workers}", *args.paths],
            cwd=work,
            env=env,
            check=False,
        )
    elapsed = time.monotonic() - started
    for floor in raised:
        log(f"{floor.name}>={floor.floor} of {floor.member}: {floor.problem()}, raise the floor")
    if tests.returncode or raised:
        log(f"floors do not hold ({elapsed:.0f} s)")
        return 1
    log(f"floors hold ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
