"""Each component image, built with buildah from the offline base (deploy/docker/build.sh,
once per session; the layer cache makes unchanged ones quick): its entry point runs inside it
(buildah run, chroot isolation: no daemon) and prints the version, as user 65532, with the OCI
labels, exactly the dependency versions of uv.lock, no build tools, and its reference, ID and
digest recorded."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from lj_runtimekit.deploy.components import COMPONENTS

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "docker" / "build.sh"
REGISTRY = "localhost/lj-runtimekit-test"
"""The tests' own tags: a developer's `make docker` images stay as they are (the layer
cache is shared, so unchanged sources are not built twice)."""
BUILD_TIMEOUT_S = 900.0
VERSION = (ROOT / "VERSION").read_text().strip()
IMAGES = {
    image.repository.removeprefix("lj-runtimekit-"): component
    for component in COMPONENTS
    for image in component.images
}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Built:
    """One image of dist/images.json (here the session's own file) and its buildah config."""

    image: str
    ref: str
    image_id: str
    digest: str
    revision: str
    config: dict[str, Any]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Runs argv in a working container of the image, as the image's user."""
        return run_in(self.ref, list(argv))


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _require_tools() -> None:
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed: make deps installs it"
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: image tests never skip)", pytrace=False)
        pytest.skip(reason)


def _buildah_json(*argv: str) -> Any:
    result = subprocess.run(
        ["buildah", *argv], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(result.stdout)


def run_in(ref: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """argv in a new working container of ref (removed after), stdout and stderr captured.

    The output goes to files on a bind mount rather than through buildah's pipes: under
    load, `buildah run --isolation chroot` once returned 0 with an empty stdout.
    """
    container = subprocess.run(
        ["buildah", "from", "--pull=never", ref],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="lj-image-run-") as out:
        Path(out).chmod(0o777)  # the image's user writes there
        try:
            result = subprocess.run(
                [
                    *("buildah", "run", "--isolation", "chroot"),
                    *("--volume", f"{out}:/lj-out:rw", container, "--"),
                    *("/bin/sh", "-c", '"$@" >/lj-out/stdout 2>/lj-out/stderr', "sh", *argv),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            subprocess.run(
                ["buildah", "rm", container], capture_output=True, timeout=60, check=False
            )
        files = {name: Path(out, name) for name in ("stdout", "stderr")}
        captured = {n: f.read_text() if f.exists() else "" for n, f in files.items()}
    return subprocess.CompletedProcess(
        result.args, result.returncode, captured["stdout"], captured["stderr"] + result.stderr
    )


def build(component: str, images_json: Path) -> None:
    """deploy/docker/build.sh COMPONENT with buildah, the tests' tags, into images_json."""
    result = subprocess.run(
        ["bash", str(BUILD), component],
        cwd=ROOT,
        env={**os.environ, "BUILDER": "buildah", "IMAGE_REGISTRY": REGISTRY}
        | {"IMAGES_JSON": str(images_json)},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"build.sh {component} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


@pytest.fixture(scope="session")
def images_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builds every component's images (the layer cache makes unchanged ones quick)."""
    _require_tools()
    out = tmp_path_factory.mktemp("images") / "images.json"
    for component in COMPONENTS:
        build(component.name, out)
    return out


@pytest.fixture(scope="session")
def built(images_json: Path) -> dict[str, Built]:
    """The built images by name (device-plugin, ..., controller-job-agent)."""
    found: dict[str, Built] = {}
    for image, entry in json.loads(images_json.read_text()).items():
        inspected = _buildah_json("inspect", "--type", "image", entry["ref"])
        found[image] = Built(
            image=image,
            ref=entry["ref"],
            image_id=entry["id"],
            digest=entry["digest"],
            revision=entry["revision"],
            config=inspected["OCIv1"]["config"],
        )
    return found


def _distribution(member: str) -> str:
    return str(tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]["name"])


def _locked(member: str) -> dict[str, str]:
    """name -> version that uv.lock gives the member on this platform (its runtime set)."""
    result = subprocess.run(
        [
            shutil.which("uv") or "uv",
            "export",
            "--frozen",
            "--no-dev",
            "--no-emit-workspace",
            "--no-hashes",
            "--no-header",
            "--package",
            _distribution(member),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    locked: dict[str, str] = {}
    for line in result.stdout.splitlines():
        if not line or line.startswith(("#", " ")):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            (spec,) = requirement.specifier
            locked[canonicalize_name(requirement.name)] = spec.version
    return locked


def test_every_image_is_built(built: dict[str, Built]) -> None:
    assert set(built) == set(IMAGES)


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_entry_point_prints_the_version_inside_the_image(
    built: dict[str, Built], image: str
) -> None:
    entrypoint = built[image].config["Entrypoint"]
    result = built[image].run(*entrypoint, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{entrypoint[0]} {VERSION}", result.stderr


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_runs_as_user_65532(built: dict[str, Built], image: str) -> None:
    assert built[image].config["User"] == "65532:65532"
    result = built[image].run("python3", "-c", "import os; print(os.getuid(), os.getgid())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["65532", "65532"], result.stderr


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_labels_carry_version_and_revision(built: dict[str, Built], image: str) -> None:
    labels = built[image].config["Labels"]
    assert labels["org.opencontainers.image.title"] == f"lj-runtimekit-{image}"
    assert labels["org.opencontainers.image.version"] == VERSION
    revision = labels["org.opencontainers.image.revision"]
    assert revision == built[image].revision
    commit = revision.removesuffix("-dirty")
    assert re.fullmatch(r"[0-9a-f]{40}", commit), revision
    subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, check=True)
    # No builder label: the same sources give the same image with another buildah.
    assert "io.buildah.version" not in labels


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dependencies_are_the_locked_versions(built: dict[str, Built], image: str) -> None:
    listing = built[image].run(
        "/opt/lj-runtimekit/bin/python",
        "-c",
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))",
    )
    assert listing.returncode == 0, listing.stderr
    installed = {canonicalize_name(n): v for n, v in json.loads(listing.stdout).items()}
    ours = {name for name in installed if name.startswith("lj-runtimekit-")}
    assert ours == {"lj-runtimekit-proto", _distribution(IMAGES[image].member)}
    assert {n: v for n, v in installed.items() if n not in ours} == _locked(IMAGES[image].member)


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_runtime_stage_has_no_build_tools(built: dict[str, Built], image: str) -> None:
    result = built[image].run(
        "python3",
        "-c",
        "import os, shutil;"
        "print(shutil.which('uv'), os.path.exists('/src'), os.path.exists('/wheels'))",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "False", "False"], result.stderr


def test_images_json_records_ref_id_and_digest(built: dict[str, Built]) -> None:
    for image, entry in built.items():
        assert entry.ref == f"{REGISTRY}/lj-runtimekit-{image}:{VERSION}"
        found = _buildah_json("inspect", "--type", "image", entry.ref)
        assert entry.image_id == f"sha256:{found['FromImageID']}"
        assert entry.digest == found["FromImageDigest"]
        assert DIGEST.fullmatch(entry.digest), entry.digest


def test_rebuild_gives_the_same_image_id(built: dict[str, Built], tmp_path: Path) -> None:
    # build.sh builds the runtime stage anew each time (no layer cache, no history, file
    # and creation times of the last commit): the same sources give the same image ID.
    again = tmp_path / "images.json"
    build("exporter", again)
    assert json.loads(again.read_text())["exporter"]["id"] == built["exporter"].image_id


def test_base_images_from_an_empty_storage(tmp_path: Path) -> None:
    """hack/base-image.sh provides both bases into an empty container storage (a fresh
    machine's), run as `uv run pytest` runs it: `python3` is the project's environment,
    which has no uv package, and UV unset, so uv is the one on PATH."""
    _require_tools()
    graph, run_root = tmp_path / "graph", tmp_path / "run"
    conf = tmp_path / "storage.conf"
    conf.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{graph}"\nrunroot = "{run_root}"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "UV"} | {
        "CONTAINERS_STORAGE_CONF": str(conf)
    }
    assert subprocess.run(
        ["python3", "-c", "import uv"], env=env, capture_output=True, check=False
    ).returncode, "python3 here has a uv package: the test would not show a fresh machine"
    try:
        result = subprocess.run(
            ["bash", str(ROOT / "hack" / "base-image.sh")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        refs = dict(line.split("=", 1) for line in result.stdout.splitlines())
        assert set(refs) == {"python", "uv"}
        for ref in refs.values():
            subprocess.run(
                ["buildah", "inspect", "--type", "image", ref],
                env=env,
                capture_output=True,
                timeout=60,
                check=True,
            )
        pinned = subprocess.run(
            ["bash", "-c", "sed -n 's/^UV_VERSION=//p' hack/bootstrap.sh"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert refs["uv"].startswith(f"localhost/lj-runtimekit-uv:{pinned}-")
    finally:
        subprocess.run(
            ["buildah", "rmi", "--all", "--force"],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        subprocess.run(
            ["buildah", "unshare", "rm", "-rf", str(graph), str(run_root)],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
