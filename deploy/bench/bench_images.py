"""The images as a fresh machine builds them: every component image built with buildah
into an empty container storage and an empty base-image cache (the bookworm root file
system made anew by mmdebstrap, the wheels downloaded anew), its wall time, and each
image's size. With --fresh-ci-log, the time of `make test` on a fresh machine as
`fresh-ci.sh` reported it. Merges its keys into bench/parts/deploy.json.

    uv run python deploy/bench/bench_images.py --out bench/parts/deploy.json
    uv run python deploy/bench/bench_images.py --fresh-ci-log /tmp/fresh-ci.out --skip-build
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lj_runtimekit.deploy.components import COMPONENTS

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "docker" / "build.sh"
REGISTRY = "localhost/lj-runtimekit-bench"
SIZE = re.compile(r"^([0-9.]+)\s*(B|kB|MB|GB)$")
UNITS = {"B": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}
FRESH_CI = re.compile(r"^fresh-ci: green in (\d+) min (\d+) s", re.MULTILINE)


def fresh_ci_seconds(log: str) -> int:
    """The seconds of a green fresh-ci.sh run from its output; ValueError if it was not green."""
    match = FRESH_CI.search(log)
    if match is None:
        raise ValueError("no 'fresh-ci: green in M min S s' line: the run was not green")
    return int(match.group(1)) * 60 + int(match.group(2))


def size_mb(text: str) -> float:
    """Megabytes (10^6 bytes) from buildah's human size ("152 MB", "1.07 GB")."""
    match = SIZE.match(text.strip())
    if match is None:
        raise ValueError(f"buildah reported an image size of {text!r}")
    return round(float(match.group(1)) * UNITS[match.group(2)], 1)


def cold_build(work: Path) -> dict[str, float]:
    """Builds every component into an empty storage under work; the wall time and sizes."""
    conf = work / "storage.conf"
    conf.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{work / "graph"}"\n'
        f'runroot = "{work / "run"}"\n'
    )
    env = os.environ | {
        "CONTAINERS_STORAGE_CONF": str(conf),
        "XDG_CACHE_HOME": str(work / "cache"),
        "BUILDER": "buildah",
        "IMAGE_REGISTRY": REGISTRY,
        "IMAGES_JSON": str(work / "images.json"),
    }
    start = time.monotonic()
    for component in COMPONENTS:
        subprocess.run(["bash", str(BUILD), component.name], cwd=ROOT, env=env, check=True)
    result: dict[str, float] = {"cold_image_build_s": round(time.monotonic() - start, 1)}
    listed = subprocess.run(
        ["buildah", "images", "--json"], env=env, capture_output=True, text=True, check=True
    )
    for image in json.loads(listed.stdout):
        for name in image.get("names") or []:
            repository = name.rsplit(":", 1)[0].removeprefix(f"{REGISTRY}/lj-runtimekit-")
            if name.startswith(f"{REGISTRY}/"):
                result[f"image_mb.{repository}"] = size_mb(str(image["size"]))
    subprocess.run(["buildah", "rmi", "--all", "--force"], env=env, capture_output=True)
    return result


def main() -> int:
    """Runs the cold build (unless --skip-build) and merges the keys into --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/parts/deploy.json"))
    parser.add_argument("--fresh-ci-log", type=Path, help="the output of fresh-ci.sh")
    parser.add_argument("--skip-build", action="store_true", help="only read --fresh-ci-log")
    args = parser.parse_args()
    result: dict[str, float] = {}
    if args.fresh_ci_log is not None:
        try:
            result["fresh_machine_make_test_s"] = fresh_ci_seconds(args.fresh_ci_log.read_text())
        except (OSError, ValueError) as err:
            print(
                f"bench_images: error: --fresh-ci-log {args.fresh_ci_log}: {err}", file=sys.stderr
            )
            return 1
    if not args.skip_build:
        with tempfile.TemporaryDirectory(prefix="lj-bench-images-") as work:
            try:
                result |= cold_build(Path(work))
            finally:
                subprocess.run(["buildah", "unshare", "rm", "-rf", work], capture_output=True)
    merged = json.loads(args.out.read_text()) if args.out.exists() else {}
    merged.update(result)
    args.out.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
