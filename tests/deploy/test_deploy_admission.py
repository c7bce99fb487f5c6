"""The components' writes bounded by the API server: the Controller's Jobs (a namespace of
their own, Pod Security labels, the Jobs admission policy) and the node agents' writes (the
own-node admission policy), on the real control plane. Every request is made as the
component's ServiceAccount (impersonation, with the node name a pod-bound token carries)
and as a server-side dry run."""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.controller.internal.config.config import JobSettings
from lj_runtimekit.controller.internal.jobspec import jobspec
from lj_runtimekit.controller.internal.nodestate.state import PREFIX, Action
from lj_runtimekit.deploy import manifests
from lj_runtimekit.deploy.components import BY_NAME, RUNTIME_SOCKET_DIR, Component
from lj_runtimekit.deviceplugin.internal.nodelabels.labels import node_labels
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.proto.pkg import protocolinfo
from lj_runtimekit.testkit.waits import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import POLICIES_SERVED

pytestmark = [
    pytest.mark.controlplane,
    pytest.mark.skipif(
        not POLICIES_SERVED,
        reason="the API server under test is older than the admission policies"
        " (docs/compatibility.md); the pinned release runs these",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = manifests.default_options(ROOT / "deploy").protocol
DEVICE_PLUGIN = BY_NAME["device-plugin"]
CONTROLLER = BY_NAME["controller"]
NODE_NAME_HEADER = "Impersonate-Extra-" + manifests.NODE_NAME_EXTRA.replace("/", "%2F")


class Install:
    """The Device Plugin's, the Exporter's and the Controller's objects, applied."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        suffix = secrets.token_hex(3)
        self.opts = manifests.Options(
            protocol_text=(ROOT / "deploy/protocol.yaml").read_text(),
            version=(ROOT / "VERSION").read_text().strip(),
            namespace=f"lj-adm-{suffix}",
            jobs_namespace=f"lj-adm-{suffix}-jobs",
        )
        components = (DEVICE_PLUGIN, BY_NAME["exporter"], CONTROLLER)
        self.text = manifests.dump(manifests.render(components, self.opts, common=False))

    def kubectl(self, *args: str, stdin: str = "") -> None:
        result = subprocess.run(
            self.cp.kubectl_argv(*args), input=stdin, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"kubectl {args}: {result.stderr}"

    def user(self, component: Component) -> str:
        return f"system:serviceaccount:{self.opts.namespace}:{component.service_account}"

    def api(self, component: Component, node: str | None) -> k8s_client.ApiClient:
        """A client acting as the component's ServiceAccount, with a token bound to a pod on
        `node` (None: a token without a node)."""
        api = self.cp.api_client()
        api.set_default_header("Impersonate-User", self.user(component))
        if node is not None:
            api.set_default_header(NODE_NAME_HEADER, node)
        return api


@pytest.fixture(scope="module")
def install(control_plane: ControlPlane) -> Iterator[Install]:
    inst = Install(control_plane)
    admin = control_plane.api_client()
    core = k8s_client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": inst.opts.namespace}})
    inst.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", stdin=inst.text)
    yield inst
    inst.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=inst.text)
    core.delete_namespace(inst.opts.namespace, propagation_policy="Background")
    admin.close()


def refusal(call: Any) -> str:
    """The API server's message refusing `call` ('' when it was allowed)."""
    try:
        call()
    except ApiException as exc:
        if exc.status not in (403, 422):
            raise
        return str(json.loads(exc.body)["message"])
    return ""


# -- the Controller's Jobs ----------------------------------------------------------------------


def controller_job(
    install: Install, node: dict[str, Any], action: Action = "enable", **settings: Any
) -> dict[str, Any]:
    """The Job the Controller creates (its own jobspec) with its Deployment's flags and
    `settings` (JobSettings fields the Deployment leaves at their defaults)."""
    args = dict(
        a.removeprefix("--").split("=", 1)
        for a in manifests.workload(CONTROLLER, install.opts)["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
        if "=" in a
    )
    job_settings = JobSettings(
        image=args["job-image"],
        namespace=install.opts.jobs_namespace,
        socket_dir=args["socket-dir"],
        service_account=args["job-service-account"],
        **settings,
    )
    meta = node["metadata"]
    return jobspec.build(
        job_settings, action, meta["name"], meta["uid"], node["spec"].get("taints")
    )


Change = Callable[[dict[str, Any], dict[str, Any]], Any]
"""Changes the Job's pod spec (first argument) or its container (second)."""


def _security(**fields: Any) -> Change:
    return lambda _p, c: c["securityContext"].update(fields)


# Each change alone, and the reason the policy gives (the server names the first rule a Job
# breaks): what the Controller never renders.
REFUSED: list[tuple[str, str, Change]] = [
    ("another image", "the image", lambda _p, c: c.update(image="busybox")),
    (
        "an image beside it",
        "the image",
        lambda _p, c: c.update(image=c["image"].rsplit(":", 1)[0] + "-x:1"),
    ),
    (
        "a second container",
        "one container",
        lambda p, c: p["containers"].append(dict(c, name="second")),
    ),
    ("another command", "the command lj-job-agent", lambda _p, c: c.update(command=["sh"])),
    ("an extra argument", "the arguments", lambda _p, c: c["args"].append("--socket-name=x")),
    ("another action", "the arguments", lambda _p, c: c["args"].__setitem__(0, "state")),
    (
        "another socket dir",
        "the arguments",
        lambda _p, c: c["args"].__setitem__(1, "--socket-dir=/"),
    ),
    (
        "another requester",
        "the arguments",
        lambda _p, c: c["args"].__setitem__(2, "--requester=kube-system/x"),
    ),
    ("args replaced", "the arguments", lambda _p, c: c.update(args=["-c", "id"])),
    ("env", "no container field env", lambda _p, c: c.update(env=[{"name": "A", "value": "b"}])),
    (
        "envFrom a Secret",
        "no container field envFrom",
        lambda _p, c: c.update(envFrom=[{"secretRef": {"name": "admin-token"}}]),
    ),
    (
        "a hostPort",
        "no container field ports",
        lambda _p, c: c.update(ports=[{"containerPort": 22, "hostPort": 22}]),
    ),
    ("a working dir", "no container field workingDir", lambda _p, c: c.update(workingDir="/")),
    (
        "GPUs",
        "cpu and memory its only resources",
        lambda _p, c: c["resources"]["limits"].update({"nvidia.com/gpu": "1"}),
    ),
    (
        "a resource claim",
        "no pod field resourceClaims",
        lambda p, c: (
            p.update(resourceClaims=[{"name": "gpu", "resourceClaimName": "gpus"}]),
            c["resources"].update(claims=[{"name": "gpu"}]),
        ),
    ),
    ("escalation", "allowPrivilegeEscalation: false", _security(allowPrivilegeEscalation=True)),
    (
        "escalation unset",
        "allowPrivilegeEscalation: false",
        lambda _p, c: c["securityContext"].pop("allowPrivilegeEscalation"),
    ),
    (
        "privileged",
        "not privileged, every capability dropped",
        _security(privileged=True, allowPrivilegeEscalation=True),
    ),
    (
        "an added capability",
        "every capability dropped and none added",
        _security(capabilities={"drop": ["ALL"], "add": ["NET_ADMIN"]}),
    ),
    (
        "capabilities kept",
        "every capability dropped",
        _security(capabilities={"drop": ["NET_RAW"]}),
    ),
    (
        "seccomp Unconfined",
        "seccomp RuntimeDefault",
        _security(seccompProfile={"type": "Unconfined"}),
    ),
    (
        "the pod's seccomp Unconfined",
        "seccomp RuntimeDefault",
        lambda p, _c: p["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    ),
    (
        "a sysctl",
        "nothing else in the pod's",
        lambda p, _c: p["securityContext"].update(
            sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]
        ),
    ),
    (
        "AppArmor unconfined",
        "no securityContext field appArmorProfile",
        _security(appArmorProfile={"type": "Unconfined"}),
    ),
    ("a writable root", "a read-only root filesystem", _security(readOnlyRootFilesystem=False)),
    (
        "the image's user",
        "runAsUser and runAsGroup set",
        lambda _p, c: c["securityContext"].pop("runAsUser"),
    ),
    (
        "a non-root uid allowed to be root",
        "runAsNonRoot exactly when runAsUser is not 0",
        _security(runAsUser=1000),
    ),
    ("a writable mount", "read-only", lambda _p, c: c["volumeMounts"][0].update(readOnly=False)),
    (
        "a mount elsewhere",
        "one mount, the socket directory",
        lambda _p, c: c["volumeMounts"][0].update(mountPath="/host"),
    ),
    (
        "another volume",
        "one volume",
        lambda p, _c: p["volumes"].append({"name": "x", "emptyDir": {}}),
    ),
    (
        "another hostPath",
        "one volume",
        lambda p, _c: p["volumes"][0]["hostPath"].update(path="/"),
    ),
    (
        "a hostPath of any type",
        "type Directory",
        lambda p, _c: p["volumes"][0]["hostPath"].pop("type"),
    ),
    ("hostPID", "no pod field hostPID", lambda p, _c: p.update(hostPID=True)),
    ("hostNetwork", "no pod field hostNetwork", lambda p, _c: p.update(hostNetwork=True)),
    ("hostIPC", "no pod field hostIPC", lambda p, _c: p.update(hostIPC=True)),
    (
        "another runtime",
        "no pod field runtimeClassName",
        lambda p, _c: p.update(runtimeClassName="lj-runtime"),
    ),
    ("nodeName", "no pod field nodeName", lambda p, _c: p.update(nodeName="any")),
    (
        "an init container",
        "no pod field initContainers",
        lambda p, c: p.update(initContainers=[dict(c, name="init")]),
    ),
    (
        "a priority class",
        "no pod field priorityClassName",
        lambda p, _c: p.update(priorityClassName="system-node-critical"),
    ),
    (
        "another service account",
        "the service account lj-runtimekit-job-agent",
        lambda p, _c: p.update(serviceAccountName="default"),
    ),
    (
        "a token",
        "no service account token",
        lambda p, _c: p.update(automountServiceAccountToken=True),
    ),
    (
        "the token's default",
        "no service account token",
        lambda p, _c: p.pop("automountServiceAccountToken"),
    ),
]


def test_the_jobs_namespace_enforces_pod_security_and_only_the_agent_job_is_admitted(
    install: Install, node_factory: NodeFactory, api_client: k8s_client.ApiClient
) -> None:
    labels = (
        k8s_client.CoreV1Api(api_client).read_namespace(install.opts.jobs_namespace).metadata.labels
    )
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "baseline"
    node = node_factory.create(f"{install.opts.namespace}-gpu-0", gpus=8, enable=False)
    node_obj = api_client.sanitize_for_serialization(
        k8s_client.CoreV1Api(api_client).read_node(node)
    )
    job = controller_job(install, node_obj)
    mount = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount == {"name": "runtime-sockets", "mountPath": RUNTIME_SOCKET_DIR, "readOnly": True}
    as_controller = install.api(CONTROLLER, None)
    batch = k8s_client.BatchV1Api(as_controller)
    jobs_ns = install.opts.jobs_namespace

    def create(obj: dict[str, Any], namespace: str = jobs_ns) -> Any:
        return lambda: batch.create_namespaced_job(namespace, obj, dry_run="All")

    attack = copy.deepcopy(job)
    pod = attack["spec"]["template"]["spec"]
    pod["serviceAccountName"] = "default"
    pod["volumes"] = [{"name": "runtime-sockets", "hostPath": {"path": "/"}}]
    pod["containers"][0]["securityContext"]["privileged"] = True
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    policy = "the Controller may create only the Job Agent's Job"

    def refused() -> bool:
        return policy in refusal(create(attack))

    wait_for(
        refused,
        30,
        "the Jobs admission policy to refuse the attack Job",
        describe=lambda: refusal(create(attack)) or "admitted",
    )
    message = refusal(create(attack))
    assert "lj-runtimekit-controller-jobs" in message
    assert "the service account lj-runtimekit-job-agent" in message
    # The API server type-checks every expression against the Job's schema: no warning.
    registration = k8s_client.AdmissionregistrationV1Api(api_client)

    def type_checking() -> Any:
        status = registration.read_validating_admission_policy(
            "lj-runtimekit-controller-jobs"
        ).status
        return status and status.type_checking

    wait_for(lambda: type_checking() is not None, 30, "the Jobs policy to be type-checked")
    assert not type_checking().expression_warnings
    wrong = []
    for what, expected, change in REFUSED:
        variant = copy.deepcopy(job)
        spec = variant["spec"]["template"]["spec"]
        change(spec, spec["containers"][0])
        message = refusal(create(variant))
        if policy not in message or expected not in message:
            wrong.append(f"{what}: {message or 'admitted'} (expected {expected!r})")
    apparmor = copy.deepcopy(job)
    key = "container.apparmor.security.beta.kubernetes.io/agent"
    apparmor["spec"]["template"]["metadata"]["annotations"][key] = "unconfined"
    if "pod annotations under lj-runtimekit.io/ only" not in refusal(create(apparmor)):
        wrong.append(f"AppArmor annotation: {refusal(create(apparmor)) or 'admitted'}")
    assert not wrong, "\n".join(wrong)
    # The Controller's own Jobs are admitted, in the Jobs' namespace only (RBAC): both
    # actions, its other identity and retry settings, after an upgrade or a rollback too
    # (another tag or a digest of the Job Agent image).
    assert refusal(create(job)) == ""
    own = [
        controller_job(install, node_obj, "disable"),
        controller_job(install, node_obj, run_as_user=65532, run_as_group=65532),
        controller_job(install, node_obj, agent_retry_timeout_s=5, image_pull_policy="Always"),
    ]
    agent = job["spec"]["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[0]
    for image in (f"{agent}:v9.9.9", f"{agent}@sha256:{'a' * 64}"):
        other = copy.deepcopy(job)
        other["spec"]["template"]["spec"]["containers"][0]["image"] = image
        own.append(other)
    for other in own:
        assert refusal(create(other)) == "", other["spec"]["template"]
    elsewhere = copy.deepcopy(job)
    elsewhere["metadata"]["namespace"] = install.opts.namespace
    assert "cannot create resource" in refusal(create(elsewhere, install.opts.namespace))
    # Anyone else is not bound by the Jobs policy (the attack Job passes admission as admin).
    admin = k8s_client.BatchV1Api(api_client)
    admin.create_namespaced_job(jobs_ns, attack, dry_run="All")
    as_controller.close()


# -- the node agents -----------------------------------------------------------------------------


def test_the_device_plugin_writes_only_its_own_node_and_pods_and_its_own_keys(
    install: Install, node_factory: NodeFactory, api_client: k8s_client.ApiClient
) -> None:
    own = node_factory.create(f"{install.opts.namespace}-own", gpus=8, enable=False)
    other = node_factory.create(f"{install.opts.namespace}-other", gpus=8, enable=False)
    admin = k8s_client.CoreV1Api(api_client)
    ns = install.opts.namespace
    for node in (own, other):
        admin.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": f"pod-{node}"[:63], "annotations": {"team": "a"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            },
        )
    own_pod, other_pod = (f"pod-{n}"[:63] for n in (own, other))
    ann = PROTOCOL.annotations
    dp_api = install.api(DEVICE_PLUGIN, own)
    dp = k8s_client.CoreV1Api(dp_api)

    def node_patch(name: str, body: dict[str, Any]) -> Any:
        return lambda: dp.patch_node(name, body, dry_run="All")

    def pod_patch(name: str, body: dict[str, Any]) -> Any:
        return lambda: dp.patch_namespaced_pod(name, ns, body, dry_run="All")

    own_keys = {
        "metadata": {
            # Every label the Device Plugin's own code writes.
            "labels": {key: "x" for key in node_labels([], "v1.15.0", PROTOCOL)},
            "annotations": {
                ann.node_devices: "[]",
                ann.node_admission: "serial",
                protocolinfo.NODE_ANNOTATION: "0" * 64,
            },
        }
    }
    taint = {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}
    say = "may write only its own node and its pods' allowed keys"

    def refused() -> bool:
        return say in refusal(node_patch(other, own_keys))

    wait_for(
        refused,
        30,
        "the own-node admission policy to refuse another node",
        describe=lambda: refusal(node_patch(other, own_keys)) or "admitted",
    )
    assert "another node" in refusal(node_patch(other, own_keys))
    assert "spec, finalizers and owners unchanged" in refusal(node_patch(own, taint))
    foreign = {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
    assert "a label key it does not own" in refusal(node_patch(own, foreign))
    assert refusal(node_patch(own, own_keys)) == ""

    record = {"metadata": {"annotations": {ann.allocated_devices: "c:0", ann.bind_phase: "x"}}}
    assert "a pod of another node" in refusal(pod_patch(other_pod, record))
    image = {"spec": {"containers": [{"name": "c", "image": "evil"}]}}
    assert "spec, finalizers and owners unchanged" in refusal(pod_patch(own_pod, image))
    team = {"metadata": {"annotations": {"team": "b"}}}
    assert "an annotation key it does not own" in refusal(pod_patch(own_pod, team))
    assert refusal(pod_patch(own_pod, record)) == ""
    dp_api.close()

    # A token not bound to a pod (or from a server < 1.30) carries no node: nothing passes.
    unbound_api = install.api(DEVICE_PLUGIN, None)
    unbound = k8s_client.CoreV1Api(unbound_api)
    message = refusal(lambda: unbound.patch_node(own, own_keys, dry_run="All"))
    assert "its token carries no node name" in message
    unbound_api.close()


def test_a_pod_bound_token_carries_its_node_to_the_policy(
    install: Install, node_factory: NodeFactory, api_client: k8s_client.ApiClient
) -> None:
    """No impersonation: the Device Plugin's real ServiceAccount token, bound to its pod on
    a node (TokenRequest, as the kubelet asks for it), patches that node and not another."""
    own = node_factory.create(f"{install.opts.namespace}-tok", gpus=8, enable=False)
    other = node_factory.create(f"{install.opts.namespace}-tok2", gpus=8, enable=False)
    admin = k8s_client.CoreV1Api(api_client)
    ns = install.opts.namespace
    pod = admin.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "device-plugin-tok"},
            "spec": {
                "nodeName": own,
                "serviceAccountName": DEVICE_PLUGIN.service_account,
                "containers": [{"name": "c", "image": "busybox"}],
            },
        },
    )
    token = admin.create_namespaced_service_account_token(
        DEVICE_PLUGIN.service_account,
        ns,
        {
            "spec": {
                "audiences": [],
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.metadata.name,
                    "uid": pod.metadata.uid,
                },
            }
        },
    ).status.token
    config = copy.copy(api_client.configuration)
    config.cert_file = config.key_file = None
    config.api_key = {"authorization": f"Bearer {token}"}
    with k8s_client.ApiClient(config) as bound_api:
        bound = k8s_client.CoreV1Api(bound_api)
        review = k8s_client.AuthenticationV1Api(bound_api).create_self_subject_review({})
        extra = review.status.user_info.extra or {}
        assert extra.get(manifests.NODE_NAME_EXTRA) == [own]
        labels = {"metadata": {"labels": {PROTOCOL.labels.device_count: "8"}}}
        wait_for(
            lambda: (
                "another node" in refusal(lambda: bound.patch_node(other, labels, dry_run="All"))
            ),
            30,
            "the own-node policy to refuse the bound token's write to another node",
        )
        assert refusal(lambda: bound.patch_node(own, labels, dry_run="All")) == ""


def test_the_controller_changes_only_its_own_keys_on_nodes(
    install: Install, node_factory: NodeFactory
) -> None:
    assert f"{PREFIX}/" == manifests.CONTROLLER_KEY_PREFIX  # the Controller's state keys
    node = node_factory.create(f"{install.opts.namespace}-ctl", gpus=8, enable=False)
    state = {
        "metadata": {
            "labels": {f"{PREFIX}/feature-state": "enabled"},
            "annotations": {f"{PREFIX}/feature-job": "x", f"{PREFIX}/feature-since": "now"},
        }
    }
    with install.api(CONTROLLER, None) as api:
        core = k8s_client.CoreV1Api(api)

        def patch(body: dict[str, Any]) -> str:
            return refusal(lambda: core.patch_node(node, body, dry_run="All"))

        taint = {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}
        wait_for(
            lambda: "the Controller may change only its own keys" in patch(taint),
            30,
            "the Controller's nodes policy to refuse a taint",
            describe=lambda: patch(taint) or "admitted",
        )
        assert "spec, finalizers and owners unchanged" in patch({"spec": {"unschedulable": True}})
        foreign = {"metadata": {"labels": {PROTOCOL.labels.enable: "false"}}}
        assert "a label key outside lj-runtimekit.io/" in patch(foreign)
        foreign = {"metadata": {"annotations": {PROTOCOL.annotations.node_devices: "[]"}}}
        assert "an annotation key outside lj-runtimekit.io/" in patch(foreign)
        assert patch(state) == ""
