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
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.deploy.components import (
    BY_NAME,
    CDI_DIR,
    CHECKSUM_ANNOTATION,
    COMPONENTS,
    CONFIG_DIR,
    DEFAULT_JOBS_NAMESPACE,
    DEFAULT_NAMESPACE,
    DEFAULT_REGISTRY,
    DEVICE_PLUGIN_DIR,
    DRA_PLUGIN,
    KUBELET_DIR,
    PART_OF,
    RUNTIME_CLASS,
    RUNTIME_SOCKET_DIR,
    Component,
    DeployError,
    image_ref,
)
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import (
    DRA_MODE,
    KNOWN_MIG_PROFILES,
    Protocol,
    parse_protocol_text,
)
from lj_runtimekit.proto.pkg.protocolinfo import NODE_ANNOTATION

Obj = dict[str, Any]

NODE_AGENT_PRIORITY_CLASS = "lj-runtimekit-node-agent"
JOB_AGENT_SERVICE_ACCOUNT = "lj-runtimekit-job-agent"
"""The Job Agent's pods talk to the Runtime only: a ServiceAccount without rights or token."""
JOB_AGENT_COMMAND = "lj-job-agent"
"""The command of the Controller's Jobs (Controller jobspec)."""
JOB_AGENT_ACTIONS = ("enable", "disable")
"""The Job Agent's first argument in the Controller's Jobs."""
METRICS_PORT = 9445
SCHEDULER_METRICS_PORT = 10261
CONTROLLER_HEALTH_PORT = 8080
KUBELET_PODS_URL = "http://$(HOST_IP):10255/pods"
"""The kubelet's read-only port; an empty `Options.kubelet_pods_url` leaves it unused (the
node agents then watch their node's pods on the API server)."""
EXPORTER_PORT_NAME = "metrics"


@dataclass(frozen=True)
class Options:
    """What the operator chose; the defaults render the committed plain YAML."""

    protocol_text: str
    version: str
    namespace: str = DEFAULT_NAMESPACE
    registry: str = DEFAULT_REGISTRY
    images: Mapping[str, str] = field(default_factory=dict)
    jobs_namespace: str = DEFAULT_JOBS_NAMESPACE
    """The Controller's Jobs (and its Lease): a namespace of their own, see `jobs_namespace`."""
    kubelet_pods_url: str = KUBELET_PODS_URL
    """The node agents' --kubelet-pods-url; empty: the kubelet read-only port is not used."""
    admission_policies: bool = True
    """The ValidatingAdmissionPolicies (Kubernetes >= 1.30) that bound the components' writes."""
    extender: bool = False
    """The scheduler as an extender of the cluster's kube-scheduler (`extender_objects`)."""
    extender_tls_secret: str = ""
    """A kubernetes.io/tls Secret (tls.crt, tls.key): the extender's serving certificate."""
    extender_client_ca_secret: str = ""
    """A Secret with ca.crt: callers present a client certificate that CA signed."""
    extender_token_secret: str = ""
    """A Secret with token: callers send `Authorization: Bearer <token>`."""
    dra: bool = False
    """DRA mode (Kubernetes >= 1.34): the DRA kubelet plugin and its DeviceClasses
    (`dra_files`) are rendered with the components."""
    dra_extended_resources: bool = False
    """The whole-device DeviceClasses name their kind's extended resource, so a pod asking
    for it without a claim is served by DRA (the DRAExtendedResource gate)."""
    dra_mig_profiles: tuple[str, ...] = KNOWN_MIG_PROFILES
    """With `dra_extended_resources`: the MIG profiles that get a DeviceClass naming their
    extended resource, so a pod asking `<resources.mig_prefix>/mig-<profile>` without a
    claim gets an instance of the profile."""

    def __post_init__(self) -> None:
        check_extender(self)

    @property
    def protocol(self) -> Protocol:
        return parse_protocol_text(self.protocol_text, "deploy/protocol.yaml")


_SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def check_extender(opts: Options) -> None:
    """The extender listens beyond loopback (the kube-scheduler calls it through a Service),
    which the scheduler allows only with TLS and an authenticated caller: refuse to render
    it without the Secrets that supply them."""
    secrets = {
        "--extender-tls-secret": opts.extender_tls_secret,
        "--extender-client-ca-secret": opts.extender_client_ca_secret,
        "--extender-token-secret": opts.extender_token_secret,
    }
    for flag, name in secrets.items():
        if name and not opts.extender:
            raise DeployError(f"{flag}={name}: only with --extender")
        if name and not _SECRET_NAME_RE.match(name):
            raise DeployError(
                f"{flag}={name}: not a Secret name (lowercase letters, digits, '-' and '.')"
            )
    if not opts.extender:
        return
    say = "--extender: the extender serves beyond loopback only with TLS and an authenticated"
    if not opts.extender_tls_secret:
        raise DeployError(
            f"{say} caller; give --extender-tls-secret=NAME (a kubernetes.io/tls Secret: its"
            " serving certificate, naming the Service)"
        )
    if not (opts.extender_client_ca_secret or opts.extender_token_secret):
        raise DeployError(
            f"{say} caller; give --extender-client-ca-secret=NAME (ca.crt: the CA of the"
            " kube-scheduler's client certificate) or --extender-token-secret=NAME (key token)"
        )


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
    "dra-plugin": (Setting("log-level", "LJ_DRA_LOG_LEVEL", "INFO"),),
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


class _Dumper(yaml.SafeDumper):
    """Writes a list or map used twice in full each time (no `&id001` anchors)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(data: Any) -> str:
    """Block-style YAML, keys in insertion order, no anchors."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def config_data(component: Component, opts: Options) -> dict[str, str]:
    """The component ConfigMap's data: protocol.yaml (not the Controller's), tunables."""
    data: dict[str, str] = {}
    if component.name != "controller":
        data["protocol.yaml"] = opts.protocol_text
    if component.name == "scheduler-framework":
        data[SCHEDULER_CONFIG_KEY] = to_yaml(scheduler_config())
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


def _rules(component: Component, opts: Options) -> list[Obj]:
    """Cluster-wide rules: only what the component's code calls (deploy/README.md, Rights)."""
    if component.name == "device-plugin":
        # Node labels and inventory annotation; the node's pods by spec.nodeName (one
        # list + watch when the kubelet /pods is off, and a list read when the kubelet's
        # copy shows several pods waiting for devices), the allocation record annotation
        # on that pod. The node-agent admission policy narrows both patches to its own node
        # and its own keys.
        return [
            _rule([""], ["nodes"], ["get", "patch"]),
            _rule([""], ["pods"], ["list", "watch", "patch"]),
        ]
    if component.name == "dra-plugin":
        # Its node's ResourceSlices (published, updated, removed; read back to reconcile;
        # the admission policy fences writes to its own node and driver); the claim read
        # by UID at NodePrepareResources; its Node, the slices' owner reference.
        return [
            _rule(
                ["resource.k8s.io"],
                ["resourceslices"],
                ["create", "update", "patch", "delete", *_READ],
            ),
            _rule(["resource.k8s.io"], ["resourceclaims"], ["get"]),
            _rule([""], ["nodes"], ["get"]),
        ]
    if component.name == "scheduler-framework" and opts.extender:
        # Extender mode: the kube-scheduler keeps the queue, the PodScheduled condition and
        # preemption; the extender caches nodes and pods, binds, and records why it refused
        # a bind. Gangs are refused, so no JobSet is read.
        return [
            _rule([""], ["nodes"], _READ),
            _rule([""], ["pods"], _READ),
            _rule([""], ["pods/binding"], ["create"]),
            _EVENTS,
        ]
    if component.name == "scheduler-framework":
        return [
            _rule([""], ["nodes"], _READ),
            _rule([""], ["pods"], _READ),
            _rule([""], ["pods/binding"], ["create"]),
            # The PodScheduled=False condition (reason and message) on a pod it cannot place,
            # and the nominated node of a preemptor.
            _rule([""], ["pods/status"], ["patch"]),
            # Preemption: the victims; the disruption budgets it must respect.
            _rule([""], ["pods"], ["delete"]),
            # One list per preemption that finds a node (no informer): no watch.
            _rule(["policy"], ["poddisruptionbudgets"], ["list"]),
            # Coscheduling reads a JobSet's size for its gang.
            _rule(["jobset.x-k8s.io"], ["jobsets"], ["get"]),
            # DRA: its cache of the driver's slices, the classes and the claims; a claim it
            # allocates gets the delete-protection finalizer (update), then the allocation
            # and the pod's reservation (status update).
            _rule(["resource.k8s.io"], ["resourceslices", "deviceclasses"], _READ),
            _rule(["resource.k8s.io"], ["resourceclaims"], [*_READ, "update"]),
            _rule(["resource.k8s.io"], ["resourceclaims/status"], ["update"]),
            _EVENTS,
        ]
    if component.name == "exporter":
        # Its node's pods by spec.nodeName: one list and watch (the source when the kubelet
        # port is off, the fallback while the kubelet does not answer).
        return [_rule([""], ["pods"], ["list", "watch"])]
    # Nodes: watch the enable label, record the Controller's state on the Node.
    return [_rule([""], ["nodes"], [*_READ, "patch"])]


def _namespaced_rules(component: Component) -> list[Obj]:
    """Rules in one namespace: the scheduler's Lease (its own namespace); the Controller's
    Jobs, their pods and its Lease (the Jobs' namespace, its --namespace)."""
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


POD_SECURITY = "pod-security.kubernetes.io"


def jobs_namespace(opts: Options) -> Obj:
    """The Controller's Jobs' namespace. The Job Agent mounts the Runtime socket directory
    (a hostPath), which only the `privileged` Pod Security level admits, so that is what is
    enforced; `baseline` is audited and warned about, and the Jobs admission policy
    allows nothing but the Agent's Job there (deploy/README.md, Controller Jobs)."""
    component = BY_NAME["controller"]
    meta = _meta(opts.jobs_namespace, component, None)
    meta["labels"] |= {
        f"{POD_SECURITY}/enforce": "privileged",
        f"{POD_SECURITY}/audit": "baseline",
        f"{POD_SECURITY}/warn": "baseline",
    }
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def rbac(component: Component, opts: Options) -> list[Obj]:
    ns = opts.namespace
    name = component.app
    subject = {"kind": "ServiceAccount", "name": component.service_account, "namespace": ns}
    objs: list[Obj] = []
    if component.name == "controller":
        objs.append(jobs_namespace(opts))
    objs += [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(component.service_account, component, ns),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(name, component, None),
            "rules": _rules(component, opts),
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
                "metadata": _meta(JOB_AGENT_SERVICE_ACCOUNT, component, opts.jobs_namespace),
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
        role_ns = opts.jobs_namespace if component.name == "controller" else ns
        objs += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": _meta(name, component, role_ns),
                "rules": namespaced,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": _meta(name, component, role_ns),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [subject],
            },
        ]
    return objs


# -- admission policies (Kubernetes >= 1.30) ---------------------------------------------------

OLDEST_MINOR = 28
"""The oldest Kubernetes 1.x minor the manifests support (docs/compatibility.md)."""
ADMISSION_POLICIES_MINOR = 30
"""The Kubernetes 1.x minor from which the policies below can be installed."""
DRA_MINOR = 34
"""The Kubernetes 1.x minor from which DRA mode can be installed (resource.k8s.io/v1)."""
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The node of the pod a ServiceAccount token is bound to (Kubernetes >= 1.30)."""
_VAP_API = "admissionregistration.k8s.io/v1"


def _username(component: Component, opts: Options) -> str:
    return f"system:serviceaccount:{opts.namespace}:{component.service_account}"


def _policy(component: Component, opts: Options, suffix: str, spec: Obj) -> list[Obj]:
    """A ValidatingAdmissionPolicy that applies to the component's identity only, and its
    binding (deny)."""
    name = f"{component.app}-{suffix}"
    identity = {
        "name": "identity",
        "expression": f"request.userInfo.username == '{_username(component, opts)}'",
    }
    binding: Obj = {"policyName": name, "validationActions": ["Deny"]}
    return [
        {
            "apiVersion": _VAP_API,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": _meta(name, component, None),
            "spec": {"failurePolicy": "Fail", **spec, "matchConditions": [identity]},
        },
        {
            "apiVersion": _VAP_API,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": _meta(name, component, None),
            "spec": binding,
        },
    ]


def _check(expression: str, message: str, message_expression: str = "") -> Obj:
    """A validation refusing with `message` (Forbidden); `message_expression` (CEL) names what
    broke the rule, `message` is the server's fallback when it cannot be evaluated."""
    check = {"expression": expression, "message": message}
    if message_expression:
        check["messageExpression"] = message_expression
    return check | {"reason": "Forbidden"}


def _only(value: str, fields: tuple[str, ...], say: str, what: str) -> Obj:
    """A check that the map `value` (CEL) has no key outside `fields`; its message names the
    other keys."""
    allowed = _cel_list(list(fields))
    return _check(
        f"{value}.all(k, k in {allowed})",
        say + f"no {what} other than {', '.join(fields)}",
        f'"{say}no {what} " + {value}.filter(k, !(k in {allowed})).join(", ")',
    )


def image_name(ref: str) -> str:
    """An image reference without its tag and digest (`registry:5000/team/agent`)."""
    name = ref.split("@", 1)[0]
    head, slash, last = name.rpartition("/")
    return head + slash + last.split(":", 1)[0]


_JOB_POD_FIELDS = (
    "containers",
    "volumes",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "enableServiceLinks",
    "restartPolicy",
    "affinity",
    "tolerations",
    "securityContext",
    "dnsPolicy",
    "schedulerName",
    "terminationGracePeriodSeconds",
)
"""The fields of the Job Agent's pod as the Controller renders it (jobspec), with those the
API server defaults (`serviceAccount` mirrors `serviceAccountName`; dnsPolicy,
schedulerName, terminationGracePeriodSeconds)."""
_JOB_CONTAINER_FIELDS = (
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "resources",
    "securityContext",
    "volumeMounts",
    "terminationMessagePath",
    "terminationMessagePolicy",
)
_JOB_SECURITY_FIELDS = (
    "allowPrivilegeEscalation",
    "privileged",
    "readOnlyRootFilesystem",
    "capabilities",
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "seccompProfile",
)


def _jobs_policy(component: Component, opts: Options) -> list[Obj]:
    """The Controller may create and change only the Job Agent's Job, the pod as its
    jobspec renders it: one container of the Job Agent image (any tag or digest of it, so
    an upgrade or a rollback of the Controller needs no change here) running lj-job-agent
    with the Controller's arguments, no other container or pod field (no env, ports, host
    namespaces, runtimeClassName, nodeName, priority class), the Job Agent's service
    account without a token, the Runtime socket directory its only volume, mounted
    read-only, cpu and memory its only resources, and its security context: no privilege
    or escalation, every capability dropped, seccomp RuntimeDefault, a read-only root.

    No parameter object: a policy whose parameter is a built-in kind stops finding it once
    its binding was deleted and created again, until the API server restarts (Kubernetes
    issue 130887), and `delete` then `deploy` does exactly that."""
    agent = image_name(
        image_ref(component.images[1], opts.registry, opts.version, dict(opts.images))
    )
    say = "the Controller may create only the Job Agent's Job: "
    security = "variables.agent.?securityContext"
    seccomp = "seccompProfile.?type.orValue('') == 'RuntimeDefault'"
    actions = _cel_list(list(JOB_AGENT_ACTIONS))
    socket_arg = f"--socket-dir={RUNTIME_SOCKET_DIR}"
    # The checks after the first may read the one container (`variables.agent`): the
    # server reports the first check a Job breaks.
    checks = [
        _check(
            "variables.pod.containers.size() == 1 && variables.pod.containers.all(c,"
            f" c.image == '{agent}' || c.image.startsWith('{agent}:')"
            f" || c.image.startsWith('{agent}@'))",
            say + f"one container, the image {agent}",
        ),
        _only("variables.pod", _JOB_POD_FIELDS, say, "pod field"),
        _check(
            f"variables.pod.?serviceAccountName.orValue('') == '{JOB_AGENT_SERVICE_ACCOUNT}'",
            say + f"the service account {JOB_AGENT_SERVICE_ACCOUNT}",
        ),
        _check(
            "variables.pod.?automountServiceAccountToken.orValue(true) == false",
            say + "no service account token (automountServiceAccountToken: false)",
        ),
        _check(
            "variables.pod.?volumes.orValue([]).size() == 1 && variables.pod.volumes.all(v,"
            " v.all(k, k in ['name', 'hostPath']) &&"
            f" v.?hostPath.?path.orValue('') == '{RUNTIME_SOCKET_DIR}' &&"
            " v.?hostPath.?type.orValue('') == 'Directory')",
            say + f"one volume, the Runtime socket directory {RUNTIME_SOCKET_DIR} (hostPath,"
            " type Directory)",
        ),
        _check(
            "object.spec.template.?metadata.?annotations.orValue({}).all(k,"
            f" k.startsWith('{CONTROLLER_KEY_PREFIX}'))",
            say + f"pod annotations under {CONTROLLER_KEY_PREFIX} only (no AppArmor or seccomp"
            " annotation)",
        ),
        _only("variables.agent", _JOB_CONTAINER_FIELDS, say, "container field"),
        _check(
            f"variables.agent.?command.orValue([]) == ['{JOB_AGENT_COMMAND}']",
            say + f"the command {JOB_AGENT_COMMAND}",
        ),
        _check(
            "variables.agent.?args.orValue([]).size() == 6 &&"
            f" variables.agent.args[0] in {actions} &&"
            f" variables.agent.args[1] == '{socket_arg}' &&"
            " variables.agent.args[2] == '--requester=' + request.namespace + '/' +"
            " object.metadata.name &&"
            " variables.agent.args[3].matches('^--retry-timeout=[1-9][0-9]*$') &&"
            " variables.agent.args[4] == '--termination-log=/dev/termination-log' &&"
            " variables.agent.args[5] == '--log-format=json'",
            say + f"the arguments {'|'.join(JOB_AGENT_ACTIONS)} {socket_arg}"
            " --requester=<namespace>/<Job name> --retry-timeout=<seconds>"
            " --termination-log=/dev/termination-log --log-format=json",
        ),
        _check(
            "variables.agent.?resources.orValue({}).all(k, k in ['requests', 'limits'] &&"
            " variables.agent.resources[k].all(r, r in ['cpu', 'memory']))",
            say + "cpu and memory its only resources (no GPU or other extended resource, no"
            " resource claim)",
        ),
        _only(f"{security}.orValue({{}})", _JOB_SECURITY_FIELDS, say, "securityContext field"),
        _check(
            f"!{security}.?privileged.orValue(false) &&"
            f" {security}.?capabilities.orValue({{}}).all(k, k == 'drop') &&"
            f" {security}.?capabilities.?drop.orValue([]) == ['ALL']",
            say + "not privileged, every capability dropped and none added",
        ),
        _check(
            f"{security}.?allowPrivilegeEscalation.orValue(true) == false",
            say + "allowPrivilegeEscalation: false",
        ),
        _check(
            f"variables.pod.?securityContext.orValue({{}}).all(k, k == 'seccompProfile') &&"
            f" variables.pod.?securityContext.?{seccomp} && {security}.?{seccomp}",
            say + "seccomp RuntimeDefault in the pod's and the container's securityContext,"
            " nothing else in the pod's",
        ),
        _check(
            f"{security}.?readOnlyRootFilesystem.orValue(false) == true",
            say + "a read-only root filesystem",
        ),
        _check(
            f"{security}.?runAsUser.hasValue() && {security}.?runAsGroup.hasValue() &&"
            f" {security}.?runAsNonRoot.orValue(false) =="
            " (variables.agent.securityContext.runAsUser != 0)",
            say + "runAsUser and runAsGroup set, runAsNonRoot exactly when runAsUser is not 0",
        ),
        _check(
            "variables.agent.?volumeMounts.orValue([]).size() == 1 &&"
            " variables.agent.volumeMounts.all(m, m.all(k, k in ['name', 'mountPath',"
            f" 'readOnly']) && m.mountPath == '{RUNTIME_SOCKET_DIR}' &&"
            " m.?readOnly.orValue(false))",
            say + f"one mount, the socket directory {RUNTIME_SOCKET_DIR} read-only",
        ),
    ]
    spec: Obj = {
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["batch"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["jobs"],
                }
            ]
        },
        "variables": [
            {"name": "pod", "expression": "object.spec.template.spec"},
            {"name": "agent", "expression": "variables.pod.containers[0]"},
        ],
        "validations": checks,
    }
    return _policy(component, opts, "jobs", spec)


def writable_keys(component: Component, protocol: Protocol) -> dict[str, list[str]]:
    """The label and annotation keys a node agent writes: `<kind>-labels`/`<kind>-annotations`
    for nodes and pods (the Device Plugin's node labels, inventory and admission mode; its
    allocation record and bind phase on pods; the Exporter writes none)."""
    keys: dict[str, list[str]] = {
        "node-labels": [],
        "node-annotations": [],
        "pod-labels": [],
        "pod-annotations": [],
    }
    if component.name == "device-plugin":
        labels_, ann = protocol.labels, protocol.annotations
        keys["node-labels"] = [
            labels_.device_kind,
            labels_.device_model,
            labels_.device_count,
            labels_.device_mode,
            labels_.runtime_version,
        ]
        # The hash of the protocol it loaded (protocolinfo; deploy-all.sh verify reads it).
        keys["node-annotations"] = [ann.node_devices, ann.node_admission, NODE_ANNOTATION]
        keys["pod-annotations"] = [ann.allocated_devices, ann.bind_phase]
    return keys


def _cel_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _changed(field_: str) -> str:
    """CEL: the keys of `metadata.<field_>` (a map) added, changed or removed by the write,
    from the variables `new_<field_>` and `old_<field_>`."""
    new, old = f"variables.new_{field_}", f"variables.old_{field_}"
    return (
        f"{new}.filter(k, !(k in {old}) || {old}[k] != {new}[k]) + {old}.filter(k, !(k in {new}))"
    )


CONTROLLER_KEY_PREFIX = "lj-runtimekit.io/"
"""The Controller's label and annotation keys on Nodes (its state, kopf's storage)."""


def _metadata_checks(say: str) -> list[Obj]:
    """The object itself (no subresource), its spec, finalizers and owners unchanged; the
    policy adds which label and annotation keys may change (`_changed`)."""
    return [
        _check("request.?subResource.orValue('') == ''", say + "no subresource"),
        _check(
            "object.spec == oldObject.spec &&"
            " object.metadata.?finalizers.orValue([]) =="
            " oldObject.metadata.?finalizers.orValue([]) &&"
            " object.metadata.?ownerReferences.orValue([]) =="
            " oldObject.metadata.?ownerReferences.orValue([])",
            say + "spec, finalizers and owners unchanged",
        ),
    ]


def _metadata_variables() -> list[Obj]:
    return [
        {"name": f"{age}_{field_}", "expression": f"{obj}.metadata.?{field_}.orValue({{}})"}
        for field_ in ("labels", "annotations")
        for age, obj in (("new", "object"), ("old", "oldObject"))
    ]


def _controller_nodes_policy(component: Component, opts: Options) -> list[Obj]:
    """The Controller updates Nodes only in its own keys (its feature state), never their
    spec (taints, unschedulable), finalizers or owners."""
    say = "the Controller may change only its own keys on a Node: "
    prefix = CONTROLLER_KEY_PREFIX
    checks = [
        *_metadata_checks(say),
        _check(
            f"({_changed('labels')}).all(k, k.startsWith('{prefix}'))",
            say + f"a label key outside {prefix}",
        ),
        _check(
            f"({_changed('annotations')}).all(k, k.startsWith('{prefix}'))",
            say + f"an annotation key outside {prefix}",
        ),
    ]
    spec: Obj = {
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["UPDATE"],
                    "resources": ["nodes", "nodes/*"],
                }
            ]
        },
        "variables": _metadata_variables(),
        "validations": checks,
    }
    return _policy(component, opts, "nodes", spec)


def _node_agent_policy(component: Component, opts: Options) -> list[Obj]:
    """A node agent writes only its own Node and the pods on it (the node of the pod its
    token is bound to), and there only its own label and annotation keys; a token without a
    node (Kubernetes < 1.30, a token not bound to a pod) writes nothing."""
    keys = writable_keys(component, opts.protocol)
    say = f"{component.app} may write only its own node and its pods' allowed keys: "
    extra = f"request.userInfo.?extra[?'{NODE_NAME_EXTRA}'].orValue([])"
    checks = [
        _check(
            "variables.node != ''",
            say + f"its token carries no node name ({NODE_NAME_EXTRA}: a token bound to"
            " its pod, Kubernetes >= 1.30)",
        ),
        _check(
            "variables.kind == 'pods' || object.metadata.name == variables.node",
            say + "another node",
        ),
        _check(
            "variables.kind == 'nodes' ||"
            " (object.spec.?nodeName.orValue('') == variables.node &&"
            " oldObject.spec.?nodeName.orValue('') == variables.node)",
            say + "a pod of another node",
        ),
        *_metadata_checks(say),
        _check(
            f"({_changed('labels')}).all(k, k in variables.labelKeys)",
            say + "a label key it does not own",
        ),
        _check(
            f"({_changed('annotations')}).all(k, k in variables.annotationKeys)",
            say + "an annotation key it does not own",
        ),
    ]
    spec: Obj = {
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["*"],
                    "operations": ["UPDATE"],
                    "resources": ["nodes", "nodes/*", "pods", "pods/*"],
                }
            ]
        },
        "variables": [
            {"name": "node", "expression": f"size({extra}) == 1 ? {extra}[0] : ''"},
            {"name": "kind", "expression": "request.resource.resource"},
            *_metadata_variables(),
            {
                "name": "labelKeys",
                "expression": f"variables.kind == 'nodes' ? {_cel_list(keys['node-labels'])}"
                f" : {_cel_list(keys['pod-labels'])}",
            },
            {
                "name": "annotationKeys",
                "expression": f"variables.kind == 'nodes'"
                f" ? {_cel_list(keys['node-annotations'])}"
                f" : {_cel_list(keys['pod-annotations'])}",
            },
        ],
        "validations": checks,
    }
    return _policy(component, opts, "own-node", spec)


def _dra_slices_policy(component: Component, opts: Options) -> list[Obj]:
    """The DRA plugin writes only its own node's ResourceSlices of our driver (the node of
    the pod its token is bound to); a token without a node writes none. The API server keeps
    a slice's node and driver (immutable), so checking the object written (the old one when
    deleted) covers an update too."""
    driver = opts.protocol.dra.driver
    say = f"{component.app} may write only its own node's ResourceSlices of driver {driver}: "
    extra = f"request.userInfo.?extra[?'{NODE_NAME_EXTRA}'].orValue([])"
    node_of = "variables.slice.spec.?nodeName.orValue('')"
    checks = [
        _check(
            "variables.node != ''",
            say + f"its token carries no node name ({NODE_NAME_EXTRA}: a token bound to"
            " its pod, Kubernetes >= 1.30)",
        ),
        _check(
            f"{node_of} == variables.node",
            say + "the ResourceSlice of another node",
            f'"{say}the ResourceSlice of node " + {node_of} + " (its own: " + variables.node + ")"',
        ),
        _check(
            f"variables.slice.spec.driver == '{driver}'",
            say + "the ResourceSlice of another driver",
            f'"{say}the ResourceSlice of driver " + variables.slice.spec.driver',
        ),
    ]
    spec: Obj = {
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["resourceslices"],
                }
            ]
        },
        "variables": [
            {"name": "node", "expression": f"size({extra}) == 1 ? {extra}[0] : ''"},
            {
                "name": "slice",
                "expression": "request.operation == 'DELETE' ? oldObject : object",
            },
        ],
        "validations": checks,
    }
    return _policy(component, opts, "own-slices", spec)


def admission(component: Component, opts: Options) -> list[Obj]:
    """The component's admission policies (none without `opts.admission_policies`)."""
    if not opts.admission_policies:
        return []
    if component.name == "dra-plugin":
        return _dra_slices_policy(component, opts)
    if component.name == "controller":
        return _jobs_policy(component, opts) + _controller_nodes_policy(component, opts)
    if component.kind == "DaemonSet":
        return _node_agent_policy(component, opts)
    return []


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
    """The node DaemonSets tolerate a taint on each device kind's resource (the device-kind
    table), on nvidia.com/gpu, and CriticalAddonsOnly."""
    keys = [*devicekind.whole_resources(protocol.resources), "nvidia.com/gpu"]
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


def _socket_probes(sockets: str) -> tuple[Obj, Obj]:
    """The plugin serves its sockets (`sockets`, a shell pattern): the device plugin one per
    resource in the plugin dir (`lj-<resource>.sock`), the DRA plugin its gRPC socket in
    its own plugin directory once it has registered.

    The kubelet removes every socket there when it restarts and the plugin serves
    them again within seconds, so liveness allows a minute and a half.
    """
    check = ["sh", "-c", f"ls {sockets} >/dev/null 2>&1"]
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


DRA_REGISTRY_DIR = f"{KUBELET_DIR}/plugins_registry"
POD_RESOURCES_DIR = f"{KUBELET_DIR}/pod-resources"
"""Where the kubelet finds plugins' registration sockets."""
RUNTIME_SOCKET_NAME = "runtime.sock"
"""The Runtime's socket in RUNTIME_SOCKET_DIR (runtimeclient's default name)."""


def dra_plugin_dir(protocol: Protocol) -> str:
    """The DRA plugin's socket and state directory: `<kubelet dir>/plugins/<driver>`."""
    return f"{KUBELET_DIR}/plugins/{protocol.dra.driver}"


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
            f"--protocol-file={protocol}",
            f"--kubelet-pods-url={opts.kubelet_pods_url}",
            "--log-format=json",
        ]
        mounts += [
            {"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR},
            {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True},
        ]
        resources = _resources("50m", "64Mi", "500m", "256Mi")
        liveness, readiness = _socket_probes(f"{DEVICE_PLUGIN_DIR}/lj-*.sock")
        root = True
    elif component.name == "dra-plugin":
        plugin_dir = dra_plugin_dir(opts.protocol)
        env.append(_env_field("NODE_NAME", "spec.nodeName"))
        args = [
            "lj-dra-plugin",
            "--node-name=$(NODE_NAME)",
            f"--runtime-socket={RUNTIME_SOCKET_DIR}/{RUNTIME_SOCKET_NAME}",
            f"--kubelet-dir={KUBELET_DIR}",
            f"--cdi-dir={CDI_DIR}",
            f"--state-dir={plugin_dir}",
            f"--protocol-file={protocol}",
            "--log-format=json",
        ]
        mounts += [
            {"name": "plugins-registry", "mountPath": DRA_REGISTRY_DIR},
            {"name": "plugin", "mountPath": plugin_dir},
            {"name": "cdi", "mountPath": CDI_DIR},
            {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True},
        ]
        resources = _resources("50m", "64Mi", "500m", "256Mi")
        liveness, readiness = _socket_probes(f"{plugin_dir}/*.sock")
        root = True
    elif component.name == "exporter":
        env += [_env_field("NODE_NAME", "spec.nodeName"), _env_field("HOST_IP", "status.hostIP")]
        args = [
            "lj-exporter",
            f"--runtime-socket-dir={RUNTIME_SOCKET_DIR}",
            f"--kubelet-pods-url={opts.kubelet_pods_url}",
            f"--port={METRICS_PORT}",
            f"--protocol-file={protocol}",
            "--log-format=json",
        ]
        mounts += [
            {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True},
            # PodResources: which containers use a DRA claim the Runtime holds.
            {"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True},
        ]
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
        if opts.extender:
            args += _extender_args(opts)
            ports.append(
                {"name": EXTENDER_PORT_NAME, "containerPort": EXTENDER_PORT, "protocol": "TCP"}
            )
            mounts += [
                {"name": volume, "mountPath": f"{EXTENDER_DIR}/{volume}", "readOnly": True}
                for volume, _ in _extender_secrets(opts)
            ]
        liveness, readiness = _http_probes("/metrics", "metrics")
        root = False
    else:
        # The Jobs (and the Lease) live in their own namespace (jobs_namespace).
        env.append({"name": "LJ_CONTROLLER_NAMESPACE", "value": opts.jobs_namespace})
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


def _volumes(component: Component, opts: Options) -> list[Obj]:
    volumes: list[Obj] = []
    if component.name != "controller":
        volumes.append({"name": "config", "configMap": {"name": component.configmap}})
    if component.name == "scheduler-framework":
        volumes += [
            {"name": volume, "secret": {"secretName": secret}}
            for volume, secret in _extender_secrets(opts)
        ]
    if component.name == "device-plugin":
        volumes.append(
            {"name": "device-plugins", "hostPath": {"path": DEVICE_PLUGIN_DIR, "type": "Directory"}}
        )
    if component.name == "exporter":
        volumes.append(
            {
                "name": "pod-resources",
                "hostPath": {"path": POD_RESOURCES_DIR, "type": "DirectoryOrCreate"},
            }
        )
    if component.name == "dra-plugin":
        volumes += [
            {
                "name": "plugins-registry",
                "hostPath": {"path": DRA_REGISTRY_DIR, "type": "Directory"},
            },
            {
                "name": "plugin",
                "hostPath": {"path": dra_plugin_dir(opts.protocol), "type": "DirectoryOrCreate"},
            },
            {"name": "cdi", "hostPath": {"path": CDI_DIR, "type": "DirectoryOrCreate"}},
        ]
    if component.name in ("device-plugin", "exporter", "dra-plugin"):
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


def _not_dra(protocol: Protocol) -> Obj:
    """Not on a DRA-mode node: there the DRA plugin serves the devices (one API per node)."""
    term = {"key": protocol.labels.device_api, "operator": "NotIn", "values": [DRA_MODE]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [term]}]
            }
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
    if volumes := _volumes(component, opts):
        pod_spec["volumes"] = volumes
    if component.kind == "DaemonSet":
        pod_spec["priorityClassName"] = (
            "system-node-critical"
            if component.name in ("device-plugin", "dra-plugin")
            else NODE_AGENT_PRIORITY_CLASS
        )
        pod_spec["nodeSelector"] = {protocol.labels.enable: "true"}
        if component.name == "dra-plugin":
            pod_spec["nodeSelector"][protocol.labels.device_api] = DRA_MODE
        if component.name == "device-plugin":
            pod_spec["affinity"] = _not_dra(protocol)
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


def disruption_budget(component: Component, opts: Options) -> Obj:
    """A voluntary disruption (a drain) leaves one of the Controller's two replicas: the
    standby that takes the Lease. The scheduler runs one replica (Recreate): a budget could
    only block drains or allow all, so it has none."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(component.app, component, opts.namespace),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": component.app}}},
    }


# -- extender mode (deploy/README.md, Scheduler extender) -----------------------------------

EXTENDER_PORT = 8888
EXTENDER_PORT_NAME = "extender"
EXTENDER_DIR = "/etc/lj-runtimekit-extender"
"""The extender's Secrets are mounted in directories under this one, named as the volumes."""
EXTENDER_FILE = "05-extender.yaml"
KUBE_SCHEDULER_CONFIG_KEY = "kube-scheduler-config.yaml"
KUBE_SCHEDULER_CONFIG_HEADER = (
    "# The KubeSchedulerConfiguration of a kube-scheduler that calls the lj-scheduler extender\n"
    "# (rendered by lj-deploy --extender from the protocol; deploy/README.md, Scheduler\n"
    "# extender). Set clientConnection.kubeconfig and the tlsConfig files to your\n"
    "# kube-scheduler's: a client certificate the extender's client CA signed, the CA of the\n"
    "# extender's serving certificate.\n"
)


def _extender_secrets(opts: Options) -> list[tuple[str, str]]:
    """(volume, Secret) of the extender's serving certificate and its callers' credential."""
    if not opts.extender:
        return []
    secrets = [("extender-tls", opts.extender_tls_secret)]
    if opts.extender_client_ca_secret:
        secrets.append(("extender-client-ca", opts.extender_client_ca_secret))
    if opts.extender_token_secret:
        secrets.append(("extender-token", opts.extender_token_secret))
    return secrets


def _extender_args(opts: Options) -> list[str]:
    """lj-scheduler's extender flags: every address, TLS, the callers authenticated."""
    args = [
        "--mode=extender",
        "--extender-address=0.0.0.0",
        f"--extender-port={EXTENDER_PORT}",
        f"--extender-tls-cert={EXTENDER_DIR}/extender-tls/tls.crt",
        f"--extender-tls-key={EXTENDER_DIR}/extender-tls/tls.key",
    ]
    if opts.extender_client_ca_secret:
        args.append(f"--extender-client-ca={EXTENDER_DIR}/extender-client-ca/ca.crt")
    if opts.extender_token_secret:
        args.append(f"--extender-token-file={EXTENDER_DIR}/extender-token/token")
    return args


def kube_scheduler_configmap(component: Component) -> str:
    return f"{component.app}-kube-scheduler-config"


def extender_url(component: Component, opts: Options) -> str:
    """The extender's address through its Service (the serving certificate must name it)."""
    return f"https://{component.app}.{opts.namespace}.svc:{EXTENDER_PORT}"


def kube_scheduler_config(component: Component, opts: Options) -> Obj:
    """The kube-scheduler's configuration with the extender stanza: the Scheduler
    Framework's sample (generated from the protocol: every managed resource), pointed at
    the extender's Service."""
    try:
        from lj_runtimekit.schedulerframework.internal.extender import sample
    except ImportError as exc:
        raise DeployError(
            "--extender: the Scheduler Framework package (its extender sample renders the"
            " kube-scheduler configuration) is not installed beside lj-deploy; run: make sync"
        ) from exc
    config: Obj = yaml.safe_load(sample.render(opts.protocol))
    (extender,) = config["extenders"]
    extender["urlPrefix"] = extender_url(component, opts)
    return config


def extender_objects(component: Component, opts: Options) -> list[Obj]:
    """The extender's Service and the kube-scheduler configuration to mount (a ConfigMap)."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(component.app, component, opts.namespace),
        "spec": {
            "selector": {"app": component.app},
            "ports": [
                {
                    "name": EXTENDER_PORT_NAME,
                    "port": EXTENDER_PORT,
                    "targetPort": EXTENDER_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }
    text = KUBE_SCHEDULER_CONFIG_HEADER + to_yaml(kube_scheduler_config(component, opts))
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(kube_scheduler_configmap(component), component, opts.namespace),
        "data": {KUBE_SCHEDULER_CONFIG_KEY: text},
    }
    return [service, configmap]


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
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS, "labels": {"app.kubernetes.io/part-of": PART_OF}},
        "handler": RUNTIME_CLASS,
    }


ADMISSION_FILE = "04-admission.yaml"


def component_files(component: Component, opts: Options) -> dict[str, list[Obj]]:
    """The component's manifest files: file name -> objects."""
    workloads: list[Obj] = []
    if component.name == "exporter":
        workloads.append(node_agent_priority_class())
    workloads.append(workload(component, opts))
    if component.name == "controller":
        workloads.append(disruption_budget(component, opts))
    files = {
        "01-rbac.yaml": rbac(component, opts),
        "02-configmap.yaml": [configmap(component, opts)],
        component.workload_file: workloads,
    }
    if policies := admission(component, opts):
        files[ADMISSION_FILE] = policies
    if component.name == "scheduler-framework" and opts.extender:
        files[EXTENDER_FILE] = extender_objects(component, opts)
    return files


DEVICE_CLASSES_FILE = "05-deviceclasses.yaml"


def device_classes(opts: Options) -> list[Obj]:
    """The DRA driver's DeviceClasses (the Device Plugin's DRA package renders them from the
    protocol), labelled as the DRA plugin's objects."""
    try:
        from lj_runtimekit.deviceplugin.internal.dra import classes
    except ImportError as exc:
        raise DeployError(
            "--dra: the Device Plugin package (it renders the DeviceClasses) is not installed"
            " beside lj-deploy; run: make sync"
        ) from exc
    try:
        out: list[Obj] = classes.device_classes(
            opts.protocol,
            extended_resources=opts.dra_extended_resources,
            mig_profiles=opts.dra_mig_profiles if opts.dra_extended_resources else (),
        )
    except ValueError as exc:
        raise DeployError(f"--dra-mig-profiles: {exc}") from exc
    for obj in out:
        obj["metadata"]["labels"] = labels(DRA_PLUGIN) | obj["metadata"].get("labels", {})
    return out


def dra_files(opts: Options) -> dict[str, list[Obj]]:
    """The DRA plugin's manifest files (deploy/draplugin/): its RBAC, ConfigMap, DaemonSet
    (on the nodes labelled `labels.device_api` = dra), admission policy and the
    DeviceClasses."""
    files = component_files(DRA_PLUGIN, opts)
    files[DEVICE_CLASSES_FILE] = device_classes(opts)
    return files


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
    if opts.dra:
        for docs in dra_files(opts).values():
            objs += docs
    return objs


def dump(objs: list[Obj], header: str = "") -> str:
    body = "---\n".join(to_yaml(o) for o in objs)
    return header + body


GENERATED_HEADER = (
    "# Generated by `make -C deploy manifests` (lj-deploy generate) from\n"
    "# deploy/manifests.py and deploy/protocol.yaml with the default options\n"
    "# (namespace kube-system, the default registry, VERSION). deploy-all.sh\n"
    "# deploy/upgrade render the same objects with your options and apply your\n"
    '# edits of this file on top (deploy/README.md, "Editing the files").\n'
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
    for name, docs in dra_files(opts).items():
        out[deploy_dir / DRA_PLUGIN.directory / name] = dump(docs, GENERATED_HEADER)
    return out
