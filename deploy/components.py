"""The deployable components: names, workloads, images (one table, used everywhere)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_JOBS_NAMESPACE = "lj-runtimekit-jobs"
"""The Controller's Jobs: a namespace of their own (deploy/README.md, Controller Jobs)."""
SHARED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
DEFAULT_REGISTRY = "lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit"
PART_OF = "lj-runtimekit"
CHECKSUM_ANNOTATION = "lj-runtimekit.io/config-checksum"
RUNTIME_CLASS = "lj-runtime"
RUNTIME_SOCKET_DIR = "/run/amp/eKitC/xdm/sockets"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_DIR = "/var/lib/kubelet"
"""The kubelet's root: the DRA plugin registers under plugins_registry/ and serves under
plugins/<driver>/."""
CDI_DIR = "/var/run/cdi"
"""Where the DRA plugin writes the CDI specs of prepared claims (the container runtime reads
them)."""
CONFIG_DIR = "/etc/lj-runtimekit"
FIELD_MANAGER = "lj-runtimekit-deploy"

_VERSION_RE = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")

WorkloadKind = Literal["DaemonSet", "Deployment"]


class DeployError(ValueError):
    """An operator mistake in the deploy options; the message says what to fix."""


@dataclass(frozen=True)
class Image:
    """One container image of a component (`key` is what `--image=<key>=<ref>` names)."""

    key: str
    repository: str


@dataclass(frozen=True)
class Component:
    """One deployable component."""

    name: str
    """As given to `--components=` (device-plugin, scheduler-framework, exporter, controller)."""
    directory: str
    """Manifest directory under deploy/ (deviceplugin, scheduler, exporter, controller)."""
    member: str
    """Workspace member directory that builds its image(s)."""
    kind: WorkloadKind
    workload: str
    images: tuple[Image, ...]
    member_config: bool = False
    """The member keeps a Kubebuilder-style `config/` (rbac/, manager/, default/) that
    `lj-deploy generate` writes from the same objects as the manifest directory."""

    @property
    def app(self) -> str:
        """Value of the `app` label on every object of the component."""
        return f"lj-runtimekit-{self.name}"

    @property
    def service_account(self) -> str:
        return self.app

    @property
    def configmap(self) -> str:
        return f"{self.app}-config"

    @property
    def workload_file(self) -> str:
        return "03-daemonset.yaml" if self.kind == "DaemonSet" else "03-deployment.yaml"

    @property
    def resource(self) -> str:
        """kubectl short form, e.g. `ds/lj-runtimekit-exporter-ds`."""
        return ("ds/" if self.kind == "DaemonSet" else "deploy/") + self.workload


COMPONENTS: tuple[Component, ...] = (
    Component(
        name="device-plugin",
        directory="deviceplugin",
        member="DevicePlugin",
        kind="DaemonSet",
        workload="lj-runtimekit-device-plugin-ds",
        images=(Image("device-plugin", "lj-runtimekit-device-plugin"),),
    ),
    Component(
        name="scheduler-framework",
        directory="scheduler",
        member="SchedulerFramework",
        kind="Deployment",
        workload="lj-runtimekit-scheduler-framework",
        images=(Image("scheduler-framework", "lj-runtimekit-scheduler-framework"),),
    ),
    Component(
        name="exporter",
        directory="exporter",
        member="Exporter",
        kind="DaemonSet",
        workload="lj-runtimekit-exporter-ds",
        images=(Image("exporter", "lj-runtimekit-exporter"),),
    ),
    Component(
        name="controller",
        directory="controller",
        member="Controller",
        kind="Deployment",
        workload="lj-runtimekit-controller",
        images=(
            Image("controller", "lj-runtimekit-controller"),
            Image("job-agent", "lj-runtimekit-controller-job-agent"),
        ),
        member_config=True,
    ),
)

BY_NAME = {c.name: c for c in COMPONENTS}
IMAGE_KEYS = tuple(image.key for c in COMPONENTS for image in c.images)

DRA_PLUGIN = Component(
    name="dra-plugin",
    directory="draplugin",
    member="DevicePlugin",
    kind="DaemonSet",
    workload="lj-runtimekit-dra-plugin-ds",
    images=COMPONENTS[0].images,
)
"""The DRA kubelet plugin (DRA mode, Kubernetes >= 1.34): the Device Plugin's image on the
nodes labelled `labels.device_api` = `dra`. Not one of COMPONENTS: it is deployed with
`--dra` (Helm: `dra.enabled`), as its DeviceClasses need resource.k8s.io/v1."""


def parse_components(text: str | None) -> tuple[Component, ...]:
    """`device-plugin,exporter` -> components in deployment order; empty/None means all."""
    if text is None or not text.strip():
        return COMPONENTS
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise DeployError(
            f"--components: unknown component {', '.join(repr(n) for n in unknown)};"
            f" known: {','.join(BY_NAME)}"
        )
    return tuple(c for c in COMPONENTS if c.name in names)


def check_version(text: str, what: str = "--version") -> str:
    """A version `v{major}.{feature}.{iteration}` (the leading v is required)."""
    if not _VERSION_RE.match(text):
        raise DeployError(
            f"{what}: {text!r} is not a version; expected v{{major}}.{{feature}}.{{iteration}},"
            " e.g. v1.15.0"
        )
    return text


def parse_image_overrides(items: list[str]) -> dict[str, str]:
    """`--image=<component>=<ref>` values -> {image key: reference}."""
    overrides: dict[str, str] = {}
    for item in items:
        key, sep, ref = item.partition("=")
        if not sep or not ref.strip():
            raise DeployError(f"--image={item}: expected <component>=<image reference>")
        if key not in IMAGE_KEYS:
            raise DeployError(
                f"--image={item}: unknown image {key!r}; known: {','.join(IMAGE_KEYS)}"
            )
        if any(ch.isspace() for ch in ref):
            raise DeployError(f"--image={item}: an image reference has no spaces")
        overrides[key] = ref
    return overrides


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A namespace name (a DNS-1123 label); also the chart's values.schema.json rule."""
_DNS_LABEL_RE = re.compile(DNS_LABEL_PATTERN)


def check_namespace(text: str) -> str:
    """A namespace name (a DNS-1123 label)."""
    if not _DNS_LABEL_RE.match(text):
        raise DeployError(
            f"--namespace={text}: not a namespace name (lowercase letters, digits and '-',"
            " at most 63 characters)"
        )
    return text


def check_jobs_namespace(text: str) -> str:
    """The Controller's Jobs namespace: a namespace name, not one the cluster shares."""
    if not _DNS_LABEL_RE.match(text):
        raise DeployError(
            f"--jobs-namespace={text}: not a namespace name (lowercase letters, digits and '-',"
            " at most 63 characters)"
        )
    if text in SHARED_NAMESPACES:
        raise DeployError(
            f"--jobs-namespace={text}: the Jobs need a namespace of their own (deploy labels it"
            f" for PodSecurity and deletes it with the Controller), e.g. {DEFAULT_JOBS_NAMESPACE}"
        )
    return text


def check_registry(text: str) -> str:
    """A registry prefix such as `registry.example.com/team` (no scheme, no spaces)."""
    if not text or "://" in text or any(ch.isspace() for ch in text):
        raise DeployError(
            f"--registry={text}: expected a registry prefix like registry.example.com/team"
            " (no scheme, no spaces)"
        )
    return text


def image_ref(
    image: Image, registry: str, version: str, overrides: dict[str, str] | None = None
) -> str:
    """The image reference: an override, else `<registry>/<repository>:<version>`."""
    if overrides and image.key in overrides:
        return overrides[image.key]
    return f"{registry.rstrip('/')}/{image.repository}:{version}"
