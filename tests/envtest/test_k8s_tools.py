"""hack/k8s-tools.sh: both pinned releases (K8S_VERSION and the DRA mode's
K8S_DRA_VERSION) in their cache directories, etcd shared between them by a link.
Stand-in binaries that report the pinned versions; nothing is built."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lj_runtimekit.envtest import load_versions

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "k8s-tools.sh"
TOOLS = "etcd kube-apiserver"


def run(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"K8S_VERSION", "K8S_DRA_VERSION", "ETCD_VERSION", "K8S_SHARED_BIN"}
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**clean, "LJ_RUNTIMEKIT_CACHE": str(cache), "K8S_TOOLS": TOOLS, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def stand_in(path: Path, output: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)


def test_both_releases_checked_and_etcd_linked(tmp_path: Path) -> None:
    versions = load_versions()
    assert versions.k8s_dra != versions.k8s
    main = tmp_path / "k8s" / versions.k8s / "bin"
    dra = tmp_path / "k8s" / versions.k8s_dra / "bin"

    missing = run(tmp_path, "--check")
    assert missing.returncode == 1
    assert f"missing or wrong version: etcd kube-apiserver (in {main})" in missing.stderr

    stand_in(main / "etcd", f"etcd Version: {versions.etcd[1:]}")
    stand_in(main / "kube-apiserver", f"Kubernetes {versions.k8s}")
    stand_in(dra / "kube-apiserver", f"Kubernetes {versions.k8s_dra}")
    # The DRA release's etcd is K8S_VERSION's, by a link: missing until made.
    no_link = run(tmp_path, "--check")
    assert no_link.returncode == 1
    assert f"all tools present for Kubernetes {versions.k8s} in {main}" in no_link.stderr
    assert f"missing or wrong version: etcd (in {dra})" in no_link.stderr

    linked = run(tmp_path)
    assert linked.returncode == 0, linked.stderr
    assert (dra / "etcd").readlink() == main / "etcd"
    checked = run(tmp_path, "--check")
    assert checked.returncode == 0, checked.stderr
    assert f"all tools present for Kubernetes {versions.k8s_dra} in {dra}" in checked.stderr

    # A kube-apiserver of the wrong release is not taken for the DRA one.
    stand_in(dra / "kube-apiserver", f"Kubernetes {versions.k8s}")
    wrong = run(tmp_path, "--check")
    assert wrong.returncode == 1
    assert f"missing or wrong version: kube-apiserver (in {dra})" in wrong.stderr


def test_k8s_version_from_the_environment_is_that_release_alone(tmp_path: Path) -> None:
    versions = load_versions()
    result = run(tmp_path, "--check", K8S_VERSION=versions.k8s)
    assert result.returncode == 1
    assert versions.k8s_dra not in result.stderr
    assert run(tmp_path, "--bin-dir").stdout.strip() == str(tmp_path / "k8s" / versions.k8s / "bin")
