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
    DeployError,
    image_ref,
)
from lj_runtimekit.proto.pkg.protocol import Protocol
from lj_runtimekit.proto.pkg.protocol.constants import parse_protocol

Obj = dict[str, Any]

NODE_AGENT_PRIORITY_CLASS = "lj-runtimekit-node-agent"
JOB_AGENT_SERVICE_ACCOUNT = "lj-runtimekit-job-agent"
"""The Job Agent's pods talk to the Runtime only: a ServiceAccount without rights or token."""
METRICS_PORT = 9445
SCHEDULER_METRICS_PORT = 10261
CONTROLLER_HEALTH_PORT = 8080
KUBELET_PODS_URL = "http://$(HOST_IP):10255/pods"
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


# -- settings (the component's tunables in its ConfigMap) --------------------------------


@dataclass(frozen=True)
class Setting:
    """One tunable: a ConfigMap key read into the environment variable its flag mirrors."""

    key: str
    env: str
    default: str


SETTINGS: Mapping[str, tuple[Setting, ...]] = {
    "device-plugin": (
        Setting("log-level", "LJ_DP_LOG_LEVEL", "INFO"),
        Setting("label-node", "LJ_DP_LABEL_NODE", "true"),
        Setting("release-grace-seconds", "LJ_DP_RELEASE_GRACE_S", "60"),
        Setting("collect-interval-seconds", "LJ_DP_COLLECT_INTERVAL_S", "30"),
    ),
    "scheduler-framework": (Setting("log-level", "LJ_SCHEDULER_LOG_LEVEL", "info"),),
    "exporter": (
        Setting("log-level", "LJ_EXPORTER_LOG_LEVEL", "INFO"),
        Setting("collection-interval-seconds", "LJ_EXPORTER_COLLECTION_INTERVAL", "15"),
        Setting("runtime-timeout-seconds", "LJ_EXPORTER_RUNTIME_TIMEOUT", "5"),
        Setting("apiserver-fallback", "LJ_EXPORTER_APISERVER_FALLBACK", "auto"),
    ),
    "controller": (
        Setting("log-level", "LJ_CONTROLLER_LOG_LEVEL", "INFO"),
        Setting("workers", "LJ_CONTROLLER_WORKERS", "32"),
        Setting("job-backoff-limit", "LJ_CONTROLLER_JOB_BACKOFF_LIMIT", "2"),
        Setting("job-active-deadline-seconds", "LJ_CONTROLLER_JOB_ACTIVE_DEADLINE", "300"),
    ),
}

SCHEDULER_CONFIG_KEY = "scheduler-config.yaml"
SCHEDULER_LEASE = "lj-runtimekit-scheduler-framework"
CONTROLLER_LEASE = "lj-runtimekit-controller"
"""The Controller's --lease-name default."""
SCHEDULER_NAME = "lj-scheduler"
GANG_PLUGIN = "Coscheduling"
"""The scheduler's gang plugin; its `requireJobSet` arg makes precheck require JobSet."""


def scheduler_config() -> Obj:
    """The LjSchedulerConfiguration (SchedulerFramework/internal/config/config.py)."""
    return {
        "apiVersion": "scheduler.lingjun.com/v1",
        "kind": "LjSchedulerConfiguration",
        "clientConnection": {"qps": 50, "burst": 100},
        "leaderElection": {
            "leaderElect": True,
            "resourceName": SCHEDULER_LEASE,
            "leaseDuration": "15s",
            "renewDeadline": "10s",
            "retryPeriod": "2s",
        },
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "pluginConfig": [
                    {
                        "name": GANG_PLUGIN,
                        "args": {
                            "defaultTimeoutSeconds": 60,
                            "backoffSeconds": 10,
                            # true when gangs come from JobSets and the cluster has no gang
                            # scheduler of its own: precheck then requires JobSet >= v0.8.0.
                            "requireJobSet": False,
                        },
                    }
                ],
            }
        ],
    }


def jobset_required(config: Obj) -> bool:
    """True when the scheduler configuration's gang plugin (Coscheduling) is enabled with
    `requireJobSet: true` (gangs from JobSets, no other gang scheduler in the cluster).

    With the Scheduler Framework installed beside this helper its own parser decides
    (it knows the default plugins and the args' defaults); otherwise the explicit
    pluginConfig is read.
    """
    try:
        from lj_runtimekit.schedulerframework.internal.config import (
            config as scheduler,
        )
    except ImportError:
        return any(
            entry.get("name") == GANG_PLUGIN and (entry.get("args") or {}).get("requireJobSet")
            for profile in config.get("profiles") or []
            for entry in profile.get("pluginConfig") or []
        )
    try:
        parsed = scheduler.parse_config(config, "scheduler-config.yaml")
    except scheduler.ConfigError as exc:
        raise DeployError(f"the scheduler configuration is not valid: {exc}") from exc
    return any(
        plugin.name == GANG_PLUGIN and bool(getattr(plugin.args, "require_job_set", False))
        for profile in parsed.profiles
        for plugin in profile.plugins
    )


def _yaml(data: Obj) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def config_data(component: Component, opts: Options) -> dict[str, str]:
    """The component ConfigMap's data: protocol.yaml (not the Controller's), tunables."""
    data: dict[str, str] = {}
    if component.name != "controller":
        data["protocol.yaml"] = opts.protocol_text
    if component.name == "scheduler-framework":
        data[SCHEDULER_CONFIG_KEY] = _yaml(scheduler_config())
    for setting in SETTINGS[component.name]:
        data[setting.key] = setting.default
    return data


# -- RBAC ------------------------------------------------------------------------------------


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> Obj:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


_READ = ["get", "list", "watch"]
_EVENTS = _rule(["", "events.k8s.io"], ["events"], ["create", "patch", "update"])
NODE_EVENTS_NAMESPACE = "default"
"""Events about Nodes (cluster-scoped) live in `default`, as the kubelet's."""


def _leases(name: str) -> list[Obj]:
    """Leader election: create the Lease once, then get/update only that one."""
    return [
        _rule(["coordination.k8s.io"], ["leases"], ["create"]),
        {**_rule(["coordination.k8s.io"], ["leases"], ["get", "update"]), "resourceNames": [name]},
    ]


def _rules(component: Component) -> list[Obj]:
    """Cluster-wide rules: only what the component's code calls."""
    if component.name == "device-plugin":
        # Node labels and inventory annotation; the node's pods by spec.nodeName (one
        # list + watch when the kubelet /pods is off, and a list read when the kubelet's
        # copy shows several pods waiting for devices), the allocation record annotation
        # on that pod.
        return [
            _rule([""], ["nodes"], ["get", "patch"]),
            _rule([""], ["pods"], ["list", "watch", "patch"]),
        ]
    if component.name == "scheduler-framework":
        return [
            _rule([""], ["nodes"], _READ),
            _rule([""], ["pods"], _READ),
            _rule([""], ["pods/binding"], ["create"]),
            # The PodScheduled=False condition (reason and message) on a pod it cannot place.
            _rule([""], ["pods/status"], ["patch"]),
            # Coscheduling reads a JobSet's size for its gang.
            _rule(["jobset.x-k8s.io"], ["jobsets"], ["get"]),
            _EVENTS,
        ]
    if component.name == "exporter":
        # The API server fallback of the kubelet /pods list (by spec.nodeName).
        return [_rule([""], ["pods"], ["list"])]
    # Nodes: watch the enable label, record the Controller's state on the Node.
    return [_rule([""], ["nodes"], [*_READ, "patch"])]


def _namespaced_rules(component: Component) -> list[Obj]:
    """Rules in the component's own namespace (leader election; the Controller's Jobs)."""
    if component.name == "scheduler-framework":
        return _leases(SCHEDULER_LEASE)
    if component.name == "controller":
        # The enable/disable Jobs, a failed Job's pods (the agent's termination message),
        # leader election (Controller/README.md, RBAC).
        return [
            _rule(["batch"], ["jobs"], [*_READ, "create", "patch", "delete"]),
            _rule([""], ["pods"], ["list"]),
            *_leases(CONTROLLER_LEASE),
        ]
    return []


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
    if component.name == "controller":
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": _meta(JOB_AGENT_SERVICE_ACCOUNT, component, ns),
                "automountServiceAccountToken": False,
            }
        )
    if component.name == "controller":
        events = f"{name}-node-events"
        objs += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": _meta(events, component, NODE_EVENTS_NAMESPACE),
                "rules": [_rule([""], ["events"], ["create"])],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": _meta(events, component, NODE_EVENTS_NAMESPACE),
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": events,
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


def _http_probes(path: str, port: str) -> tuple[Obj, Obj]:
    liveness = {
        "httpGet": {"path": path, "port": port},
        "initialDelaySeconds": 10,
        "periodSeconds": 20,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    readiness = {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    return liveness, readiness


def _socket_probes() -> tuple[Obj, Obj]:
    """The plugin serves a socket per resource in the plugin dir (`lj-<resource>.sock`).

    The kubelet removes every socket there when it restarts and the plugin serves
    them again within seconds, so liveness allows a minute and a half.
    """
    check = ["sh", "-c", f"ls {DEVICE_PLUGIN_DIR}/lj-*.sock >/dev/null 2>&1"]
    liveness = {
        "exec": {"command": check},
        "initialDelaySeconds": 30,
        "periodSeconds": 30,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    readiness = {
        "exec": {"command": check},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    return liveness, readiness


def _container(component: Component, opts: Options) -> Obj:
    """The container: command line (the real flags), environment, mounts, probes, resources."""
    image = image_ref(component.images[0], opts.registry, opts.version, dict(opts.images))
    protocol = f"{CONFIG_DIR}/protocol.yaml"
    mounts: list[Obj] = []
    if component.name != "controller":
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    env: list[Obj] = []
    ports: list[Obj] = []
    if component.name == "device-plugin":
        env += [_env_field("NODE_NAME", "spec.nodeName"), _env_field("HOST_IP", "status.hostIP")]
        args = [
            "lj-device-plugin",
            f"--plugin-dir={DEVICE_PLUGIN_DIR}",
            f"--runtime-socket-dir={RUNTIME_SOCKET_DIR}",
            f"--protocol={protocol}",
            f"--kubelet-pods-url={KUBELET_PODS_URL}",
            "--log-format=json",
        ]
        mounts += [
            {"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR},
            {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True},
        ]
        resources = _resources("50m", "64Mi", "500m", "256Mi")
        liveness, readiness = _socket_probes()
        root = True
    elif component.name == "exporter":
        env += [_env_field("NODE_NAME", "spec.nodeName"), _env_field("HOST_IP", "status.hostIP")]
        args = [
            "lj-exporter",
            f"--runtime-socket-dir={RUNTIME_SOCKET_DIR}",
            f"--kubelet-pods-url={KUBELET_PODS_URL}",
            f"--port={METRICS_PORT}",
            f"--protocol-file={protocol}",
            "--log-format=json",
        ]
        mounts.append(
            {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True}
        )
        resources = _resources("100m", "128Mi", "1", "512Mi")
        ports.append({"name": EXPORTER_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"})
        liveness, readiness = _http_probes("/healthz", EXPORTER_PORT_NAME)
        root = True
    elif component.name == "scheduler-framework":
        env.append(_env_field("LJ_SCHEDULER_LEASE_NAMESPACE", "metadata.namespace"))
        args = [
            "lj-scheduler",
            f"--config={CONFIG_DIR}/{SCHEDULER_CONFIG_KEY}",
            f"--protocol-file={protocol}",
            f"--metrics-port={SCHEDULER_METRICS_PORT}",
            "--log-format=json",
        ]
        resources = _resources("200m", "256Mi", "2", "1Gi")
        ports.append(
            {"name": "metrics", "containerPort": SCHEDULER_METRICS_PORT, "protocol": "TCP"}
        )
        liveness, readiness = _http_probes("/metrics", "metrics")
        root = False
    else:
        env.append(_env_field("LJ_CONTROLLER_NAMESPACE", "metadata.namespace"))
        job_image = image_ref(component.images[1], opts.registry, opts.version, dict(opts.images))
        args = [
            "lj-controller",
            f"--job-image={job_image}",
            f"--label-key={opts.protocol.labels.enable}",
            f"--socket-dir={RUNTIME_SOCKET_DIR}",
            f"--job-service-account={JOB_AGENT_SERVICE_ACCOUNT}",
            f"--health-port={CONTROLLER_HEALTH_PORT}",
            "--log-format=json",
        ]
        resources = _resources("100m", "128Mi", "1", "512Mi")
        ports.append({"name": "health", "containerPort": CONTROLLER_HEALTH_PORT, "protocol": "TCP"})
        liveness, readiness = _http_probes("/healthz", "health")
        root = False
    env += [
        {
            "name": setting.env,
            "valueFrom": {"configMapKeyRef": {"name": component.configmap, "key": setting.key}},
        }
        for setting in SETTINGS[component.name]
    ]
    container: Obj = {
        "name": component.name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": args[:1],
        "args": args[1:],
        "env": env,
    }
    if ports:
        container["ports"] = ports
    if mounts:
        container["volumeMounts"] = mounts
    container |= {
        "resources": resources,
        "livenessProbe": liveness,
        "readinessProbe": readiness,
        "securityContext": _security(root),
    }
    return container


def _volumes(component: Component) -> list[Obj]:
    volumes: list[Obj] = []
    if component.name != "controller":
        volumes.append({"name": "config", "configMap": {"name": component.configmap}})
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


def _spread(component: Component) -> Obj:
    """Prefer the replicas on different nodes."""
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": component.app}},
                    },
                }
            ]
        }
    }


def workload(component: Component, opts: Options) -> Obj:
    """The DaemonSet or Deployment, its pod template carrying the config checksum."""
    protocol = opts.protocol
    selector = {"app": component.app}
    pod_spec: Obj = {
        "serviceAccountName": component.service_account,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(component, opts)],
    }
    if volumes := _volumes(component):
        pod_spec["volumes"] = volumes
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
        pod_spec["tolerations"] = [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
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
    elif component.name == "controller":
        # One leader through the Lease, a standby that takes over within --lease-duration;
        # both answer /healthz (liveness and readiness: a standby is a healthy replica,
        # leadership is in the Lease), so rollouts complete.
        spec["replicas"] = 2
        spec["revisionHistoryLimit"] = 10
        spec["strategy"] = {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
        }
        pod_spec["affinity"] = _spread(component)
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
