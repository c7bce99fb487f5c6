"""Pinned tool versions (hack/versions.env) and where their binaries live."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

TOOLS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)

_LINE = re.compile(r"^([A-Z0-9_]+)=(\S*)$")


def minor(version: str) -> int:
    """The minor release of a Kubernetes version: 34 for v1.34.4."""
    return int(version.split(".")[1])


class ToolsMissingError(RuntimeError):
    """The control plane binaries are not built; the message says how to get them."""


@dataclass(frozen=True)
class ToolVersions:
    """Versions pinned in hack/versions.env: `k8s` for everything, `k8s_dra` for the DRA
    mode's control plane and hollow nodes (docs/compatibility.md)."""

    k8s: str
    etcd: str
    kwok: str
    helm: str
    k8s_dra: str

    @property
    def k8s_minor(self) -> int:
        """The Kubernetes minor release: 34 for v1.34.4."""
        return minor(self.k8s)


def parse_versions_env(text: str) -> dict[str, str]:
    """Parses KEY=value lines; comments and blank lines are ignored."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"versions.env line {number}: expected KEY=value, got {raw!r}")
        values[match.group(1)] = match.group(2)
    return values


def load_versions() -> ToolVersions:
    """Reads the pinned versions; K8S_VERSION, K8S_DRA_VERSION etc. in the environment
    override them."""
    text = resources.files("lj_runtimekit.envtest").joinpath("versions.env").read_text()
    values = parse_versions_env(text)
    try:
        return ToolVersions(
            k8s=os.environ.get("K8S_VERSION") or values["K8S_VERSION"],
            etcd=os.environ.get("ETCD_VERSION") or values["ETCD_VERSION"],
            kwok=os.environ.get("KWOK_VERSION") or values["KWOK_VERSION"],
            helm=os.environ.get("HELM_VERSION") or values["HELM_VERSION"],
            k8s_dra=os.environ.get("K8S_DRA_VERSION") or values["K8S_DRA_VERSION"],
        )
    except KeyError as exc:
        raise ValueError(f"hack/versions.env lacks {exc.args[0]}") from None


def cache_dir() -> Path:
    """Root of the per-version tool cache (outside the repository)."""
    configured = os.environ.get("LJ_RUNTIMEKIT_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "lj-runtimekit"


def version_dir(k8s: str | None = None) -> Path:
    """Directory of one Kubernetes version's tools and build records (default: the pinned
    K8S_VERSION)."""
    return cache_dir() / "k8s" / (k8s or load_versions().k8s)


def bin_dir(k8s: str | None = None) -> Path:
    """Directory holding one Kubernetes version's binaries (default: the pinned
    K8S_VERSION, whose directory LJ_RUNTIMEKIT_K8S_BIN overrides)."""
    configured = os.environ.get("LJ_RUNTIMEKIT_K8S_BIN")
    if configured and (k8s is None or k8s == load_versions().k8s):
        return Path(configured)
    return version_dir(k8s) / "bin"


def find_tools(names: tuple[str, ...] = TOOLS, k8s: str | None = None) -> dict[str, Path]:
    """Paths of the named binaries of Kubernetes `k8s` (default: the pinned K8S_VERSION);
    raises ToolsMissingError naming `make k8s-tools`."""
    directory = bin_dir(k8s)
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in names:
        path = directory / name
        if path.is_file() and os.access(path, os.X_OK):
            found[name] = path
        else:
            missing.append(name)
    if missing:
        raise ToolsMissingError(
            f"Kubernetes tools missing from {directory}: {', '.join(missing)}. "
            "Build them with `make k8s-tools` (hack/k8s-tools.sh; a cold build takes "
            "about 9 minutes on 2 cores)."
        )
    return found
