"""Builds every Kubernetes object of a deployment (the one source of the manifests).

`deploy/<component>/0*.yaml` are these objects rendered with the defaults
(`lj-deploy generate` writes them, a test checks they are current);
`deploy-all.sh` renders them again with the operator's namespace, registry,
version and image overrides. The Helm chart and the kustomizations render the
same objects (a test compares them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.deploy.components import (
    CHECKSUM_ANNOTATION,
    COMPONENTS,
    CONFIG_DIR,
    DEFAULT_NAMESPACE,
    DEFAULT_REGISTRY,
    DEVICE_PLUGIN_DIR,
    PART_OF,
    RUNTIME_CLASS,
    RUNTIME_SOCKET_DIR,
    Component,
    image_ref,
)
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.proto.pkg.protocol.constants import parse_protocol

Obj = dict[str, Any]

NODE_AGENT_PRIORITY_CLASS = "lj-runtimekit-node-agent"
METRICS_PORT = 9400
EXPORTER_PORT_NAME = "metrics"


@dataclass(frozen=True)
class Options:
    """What the operator chose; the defaults render the committed plain YAML."""

    protocol_text: str
    version: str
    namespace: str = DEFAULT_NAMESPACE
    registry: str = DEFAULT_REGISTRY
    images: Mapping[str, str] = field(default_factory=dict)
    runtime_class_api: str = "node.k8s.io/v1"

    @property
    def protocol(self) -> Protocol:
        return parse_protocol(yaml.safe_load(self.protocol_text), "deploy/protocol.yaml")


def config_checksum(data: Mapping[str, str]) -> str:
    """sha256 of the ConfigMap data as Go's json.Marshal writes it (Helm's `toJson`)."""
    text = json.dumps(dict(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return hashlib.sha256(text.encode()).hexdigest()


def labels(component: Component) -> dict[str, str]:
    return {
        "app": component.app,
        "app.kubernetes.io/name": component.app,
        "app.kubernetes.io/part-of": PART_OF,
    }


def _meta(name: str, component: Component, namespace: str | None) -> Obj:
    meta: Obj = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = labels(component)
    return meta


# -- settings (the component's own config file in its ConfigMap) ---------------------------


def settings(component: Component) -> Obj:
    """Default component settings, as the component's `--config` file reads them.

    Nothing here depends on the deploy options (the namespace comes from the
    downward API, images are flags), so the kustomizations and the Helm chart
    carry the same text.
    """
    if component.name == "device-plugin":
        return {"devicePluginDir": DEVICE_PLUGIN_DIR, "runtimeSocketDir": RUNTIME_SOCKET_DIR}
    if component.name == "scheduler-framework":
        return {
            "schedulerName": "lj-runtimekit-scheduler",
            "leaderElection": {"leaderElect": True},
            "gang": {"enabled": True, "requireJobSet": True, "minJobSetVersion": "v0.8.0"},
        }
    if component.name == "exporter":
        return {
            "kubeletReadOnlyPort": 10255,
            "listenPort": METRICS_PORT,
            "runtimeSocketDir": RUNTIME_SOCKET_DIR,
        }
    return {"runtimeSocketDir": RUNTIME_SOCKET_DIR}


def settings_text(component: Component) -> str:
    return yaml.safe_dump(settings(component), sort_keys=True, default_flow_style=False)


def config_data(component: Component, opts: Options) -> dict[str, str]:
    return {
        "protocol.yaml": opts.protocol_text,
        component.settings_key: settings_text(component),
    }


# -- RBAC ------------------------------------------------------------------------------------


def _rules(component: Component) -> list[Obj]:
    events = {
        "apiGroups": ["", "events.k8s.io"],
        "resources": ["events"],
        "verbs": ["create", "patch"],
    }
    if component.name == "device-plugin":
        return [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
            events,
        ]
    if component.name == "scheduler-framework":
        return [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["get", "list", "watch", "patch", "update"],
            },
            {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
            {
                "apiGroups": ["jobset.x-k8s.io"],
                "resources": ["jobsets"],
                "verbs": ["get", "list", "watch"],
            },
            events,
        ]
    if component.name == "exporter":
        return [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        ]
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {
            "apiGroups": ["batch"],
            "resources": ["jobs"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        events,
    ]


def _namespaced_rules(component: Component) -> list[Obj]:
    """Leader election (one active replica) for the two Deployments."""
    if component.kind != "Deployment":
        return []
    return [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "update", "patch"],
        }
    ]


def rbac(component: Component, opts: Options) -> list[Obj]:
    ns = opts.namespace
    name = component.app
    subject = {"kind": "ServiceAccount", "name": component.service_account, "namespace": ns}
    objs: list[Obj] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(component.service_account, component, ns),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(name, component, None),
            "rules": _rules(component),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(name, component, None),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [subject],
        },
    ]
    namespaced = _namespaced_rules(component)
    if namespaced:
        objs += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": _meta(name, component, ns),
                "rules": namespaced,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": _meta(name, component, ns),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [subject],
            },
        ]
    return objs


def configmap(component: Component, opts: Options) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(component.configmap, component, opts.namespace),
        "data": config_data(component, opts),
    }


# -- workloads -------------------------------------------------------------------------------


def _env_field(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _resources(cpu: str, memory: str, cpu_limit: str, memory_limit: str) -> Obj:
    return {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu_limit, "memory": memory_limit},
    }


def _security(root: bool) -> Obj:
    """No privilege, no capabilities, read-only root; uid 0 only where a host socket needs it."""
    ctx: Obj = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    if root:
        ctx["runAsUser"] = 0
        ctx["runAsNonRoot"] = False
    else:
        ctx |= {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True}
    return ctx


def _tolerations(protocol: Protocol) -> list[Obj]:
    keys = [
        protocol.resources.gpu,
        protocol.resources.ppu,
        protocol.resources.amd,
        "nvidia.com/gpu",
    ]
    tolerations: list[Obj] = [
        {"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in dict.fromkeys(keys)
    ]
    tolerations.append({"key": "CriticalAddonsOnly", "operator": "Exists"})
    return tolerations


def _container(component: Component, opts: Options) -> Obj:
    """The container: command line, environment, mounts, probes, resources, security."""
    image = image_ref(component.images[0], opts.registry, opts.version, dict(opts.images))
    config = f"{CONFIG_DIR}/{component.settings_key}"
    protocol = f"{CONFIG_DIR}/protocol.yaml"
    mounts: list[Obj] = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    env: list[Obj] = [
        _env_field("NODE_NAME", "spec.nodeName"),
        _env_field("POD_NAMESPACE", "metadata.namespace"),
        _env_field("POD_NAME", "metadata.name"),
    ]
    ports: list[Obj] = []
    if component.name == "device-plugin":
        args = [
            "lj-device-plugin",
            f"--config={config}",
            f"--protocol-config={protocol}",
            f"--runtime-socket-dir={RUNTIME_SOCKET_DIR}",
            f"--device-plugin-dir={DEVICE_PLUGIN_DIR}",
            "--health-port=8081",
        ]
        mounts += [
            {"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR},
            {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True},
        ]
        resources = _resources("50m", "64Mi", "500m", "256Mi")
        ports.append({"name": "health", "containerPort": 8081, "protocol": "TCP"})
        health_port: str | int = "health"
        root = True
    elif component.name == "exporter":
        env.append(_env_field("HOST_IP", "status.hostIP"))
        args = [
            "lj-exporter",
            f"--config={config}",
            f"--protocol-config={protocol}",
            f"--runtime-socket-dir={RUNTIME_SOCKET_DIR}",
            f"--port={METRICS_PORT}",
            "--kubelet-url=http://$(HOST_IP):10255",
        ]
        mounts.append(
            {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True}
        )
        resources = _resources("100m", "128Mi", "1", "512Mi")
        ports.append({"name": EXPORTER_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"})
        health_port = EXPORTER_PORT_NAME
        root = True
    elif component.name == "scheduler-framework":
        args = [
            "lj-scheduler",
            f"--config={config}",
            f"--protocol-config={protocol}",
            "--health-port=10259",
        ]
        resources = _resources("200m", "256Mi", "2", "1Gi")
        ports.append({"name": "health", "containerPort": 10259, "protocol": "TCP"})
        health_port = "health"
        root = False
    else:
        args = [
            "lj-controller",
            f"--config={config}",
            f"--protocol-config={protocol}",
            "--job-agent-image="
            + image_ref(component.images[1], opts.registry, opts.version, dict(opts.images)),
            "--health-port=8081",
        ]
        resources = _resources("100m", "128Mi", "1", "512Mi")
        ports.append({"name": "health", "containerPort": 8081, "protocol": "TCP"})
        health_port = "health"
        root = False
    probe_path = "/metrics" if component.name == "exporter" else "/healthz"
    container: Obj = {
        "name": component.name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": args[:1],
        "args": args[1:],
        "env": env,
        "ports": ports,
        "volumeMounts": mounts,
        "resources": resources,
        "livenessProbe": {
            "httpGet": {"path": probe_path, "port": health_port},
            "initialDelaySeconds": 10,
            "periodSeconds": 20,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {
                "path": "/readyz" if probe_path == "/healthz" else probe_path,
                "port": health_port,
            },
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "securityContext": _security(root),
    }
    return container


def _volumes(component: Component) -> list[Obj]:
    volumes: list[Obj] = [{"name": "config", "configMap": {"name": component.configmap}}]
    if component.name == "device-plugin":
        volumes.append(
            {"name": "device-plugins", "hostPath": {"path": DEVICE_PLUGIN_DIR, "type": "Directory"}}
        )
    if component.name in ("device-plugin", "exporter"):
        volumes.append(
            {
                "name": "runtime-sockets",
                "hostPath": {"path": RUNTIME_SOCKET_DIR, "type": "Directory"},
            }
        )
    return volumes


def workload(component: Component, opts: Options) -> Obj:
    """The DaemonSet or Deployment, its pod template carrying the config checksum."""
    protocol = opts.protocol
    selector = {"app": component.app}
    pod_spec: Obj = {
        "serviceAccountName": component.service_account,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(component, opts)],
        "volumes": _volumes(component),
    }
    if component.kind == "DaemonSet":
        pod_spec["priorityClassName"] = (
            "system-node-critical"
            if component.name == "device-plugin"
            else NODE_AGENT_PRIORITY_CLASS
        )
        pod_spec["nodeSelector"] = {protocol.labels.enable: "true"}
        pod_spec["tolerations"] = _tolerations(protocol)
    else:
        pod_spec["priorityClassName"] = "system-cluster-critical"
    template = {
        "metadata": {
            "labels": labels(component),
            "annotations": {CHECKSUM_ANNOTATION: config_checksum(config_data(component, opts))},
        },
        "spec": pod_spec,
    }
    spec: Obj = {"selector": {"matchLabels": selector}, "template": template}
    if component.kind == "DaemonSet":
        spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
        spec["revisionHistoryLimit"] = 10
    else:
        spec["replicas"] = 1
        spec["revisionHistoryLimit"] = 10
        spec["strategy"] = {"type": "Recreate"}
    return {
        "apiVersion": "apps/v1",
        "kind": component.kind,
        "metadata": _meta(component.workload, component, opts.namespace),
        "spec": spec,
    }


def node_agent_priority_class() -> Obj:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": NODE_AGENT_PRIORITY_CLASS,
            "labels": {"app.kubernetes.io/part-of": PART_OF},
        },
        "value": 100000000,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "LJ Runtime Kit node agents (exporter): above workloads, below system pods",
    }


def runtime_class(opts: Options) -> Obj:
    return {
        "apiVersion": opts.runtime_class_api,
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS, "labels": {"app.kubernetes.io/part-of": PART_OF}},
        "handler": RUNTIME_CLASS,
    }


def component_files(component: Component, opts: Options) -> dict[str, list[Obj]]:
    """The component's manifest files: file name -> objects."""
    workloads: list[Obj] = []
    if component.name == "exporter":
        workloads.append(node_agent_priority_class())
    workloads.append(workload(component, opts))
    return {
        "01-rbac.yaml": rbac(component, opts),
        "02-configmap.yaml": [configmap(component, opts)],
        component.workload_file: workloads,
    }


def common_files(opts: Options) -> dict[str, list[Obj]]:
    """Cluster-wide objects shared by every component (deploy/common/)."""
    return {"runtimeclass.yaml": [runtime_class(opts)]}


def render(components: tuple[Component, ...], opts: Options, *, common: bool = True) -> list[Obj]:
    """Every object of the chosen components, in apply order."""
    objs: list[Obj] = []
    if common:
        for docs in common_files(opts).values():
            objs += docs
    for component in components:
        for docs in component_files(component, opts).values():
            objs += docs
    return objs


def dump(objs: list[Obj], header: str = "") -> str:
    body = "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objs)
    return header + body


GENERATED_HEADER = (
    "# Generated by `make -C deploy manifests` (lj-deploy generate) from\n"
    "# deploy/manifests.py and deploy/protocol.yaml with the default options\n"
    "# (namespace kube-system, the default registry, VERSION). Do not edit:\n"
    "# deploy-all.sh renders the same objects with your options.\n"
)


def default_options(deploy_dir: Path) -> Options:
    version = (deploy_dir.parent / "VERSION").read_text().strip()
    return Options(protocol_text=(deploy_dir / "protocol.yaml").read_text(), version=version)


def plain_files(deploy_dir: Path) -> dict[Path, str]:
    """Path -> content of every generated plain YAML file."""
    opts = default_options(deploy_dir)
    out: dict[Path, str] = {}
    for name, docs in common_files(opts).items():
        out[deploy_dir / "common" / name] = dump(docs, GENERATED_HEADER)
    for component in COMPONENTS:
        for name, docs in component_files(component, opts).items():
            out[deploy_dir / component.directory / name] = dump(docs, GENERATED_HEADER)
    return out
