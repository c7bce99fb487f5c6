"""DRA mode deployed on a real control plane of the DRA mode's release (DRA_VERSION): the
generated objects apply, the node label chooses the DRA plugin or the Device Plugin, the DRA
plugin's identity writes only its own node's ResourceSlices of our driver (impersonation with
the node name a pod-bound token carries), and the chart renders the same objects."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.deploy import cli, manifests, verify
from lj_runtimekit.deploy.components import BY_NAME, COMPONENTS, DRA_PLUGIN
from lj_runtimekit.envtest import (
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    dra_gates,
    find_tools,
)
from lj_runtimekit.envtest.controlplane import ControlPlaneError
from lj_runtimekit.envtest.nodes import NodeFactory, ProtocolNames
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, KNOWN_MIG_PROFILES
from lj_runtimekit.testkit.waits import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_charts import plain, template, tool, unhelmed

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
OPTS = manifests.default_options(ROOT / "deploy")
PROTOCOL = OPTS.protocol
DRIVER = PROTOCOL.dra.driver
NODE_NAME_HEADER = "Impersonate-Extra-" + manifests.NODE_NAME_EXTRA.replace("/", "%2F")
RESOURCE = ("resource.k8s.io", "v1")
POLICY_SAYS = f"may write only its own node's ResourceSlices of driver {DRIVER}"


class Install:
    """Every component with DRA mode (extended resources on), in a namespace of its own, on a
    control plane with the DRA gates."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        suffix = secrets.token_hex(3)
        self.opts = dataclasses.replace(
            OPTS,
            namespace=f"lj-dra-{suffix}",
            jobs_namespace=f"lj-dra-{suffix}-jobs",
            dra=True,
            dra_extended_resources=True,
        )
        self.objects = manifests.render(COMPONENTS, self.opts, common=False)
        self.admin = cp.api_client()

    def kubectl(self, *args: str, stdin: str = "") -> str:
        result = subprocess.run(
            self.cp.kubectl_argv(*args), input=stdin, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"kubectl {args}: {result.stderr}"
        return result.stdout

    def as_plugin(self, node: str | None) -> k8s_client.ApiClient:
        """A client acting as the DRA plugin's ServiceAccount, its token bound to a pod on
        `node` (None: a token without a node)."""
        api = self.cp.api_client()
        user = f"system:serviceaccount:{self.opts.namespace}:{DRA_PLUGIN.service_account}"
        api.set_default_header("Impersonate-User", user)
        if node is not None:
            api.set_default_header(NODE_NAME_HEADER, node)
        return api


@pytest.fixture(scope="module")
def install() -> Iterator[Install]:
    cp = ControlPlane(ControlPlaneConfig(version=DRA_VERSION, feature_gates=dra_gates(DRA_VERSION)))
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"control plane did not start: {exc}", pytrace=False)
    try:
        inst = Install(cp)
        k8s_client.CoreV1Api(inst.admin).create_namespace(
            {"metadata": {"name": inst.opts.namespace}}
        )
        inst.kubectl(
            "apply",
            "--server-side",
            "--field-manager=test",
            "-f",
            "-",
            stdin=manifests.dump(inst.objects),
        )
        # The API server enforces a new policy once its informer has it.
        plugin = custom(inst.as_plugin("node-a"))
        wait_for(
            lambda: (
                POLICY_SAYS
                in refusal(
                    lambda: plugin.create_cluster_custom_object(
                        *RESOURCE,
                        "resourceslices",
                        resource_slice("probe", "node-b"),
                        dry_run="All",
                    )
                )
            ),
            30,
            "the own-slices admission policy in force",
        )
        yield inst
        inst.admin.close()
    finally:
        cp.stop()


def custom(api: k8s_client.ApiClient) -> k8s_client.CustomObjectsApi:
    return k8s_client.CustomObjectsApi(api)


def refusal(call: Callable[[], Any]) -> str:
    """The API server's message refusing `call` ('' when it was allowed)."""
    try:
        call()
    except ApiException as exc:
        if exc.status not in (403, 422):
            raise
        return str(json.loads(exc.body)["message"])
    return ""


def resource_slice(name: str, node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(RESOURCE),
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def test_generated_objects_apply_with_the_dra_gates(install: Install) -> None:
    """Every rendered object is on the server as rendered: the DeviceClasses keep their
    extended resource (DRAExtendedResource), the DaemonSet its selector and mounts."""
    classes = custom(install.admin).list_cluster_custom_object(
        *RESOURCE, "deviceclasses", label_selector=f"app={DRA_PLUGIN.app}"
    )["items"]
    rendered = {o["metadata"]["name"]: o for o in manifests.device_classes(install.opts)}
    assert {c["metadata"]["name"] for c in classes} == set(rendered)
    whole = PROTOCOL.dra.whole_class("gpu")
    (live,) = [c for c in classes if c["metadata"]["name"] == whole]
    assert live["spec"]["extendedResourceName"] == PROTOCOL.resources.gpu
    assert live["spec"]["selectors"] == rendered[whole]["spec"]["selectors"]
    assert {PROTOCOL.dra.share_class("gpu"), PROTOCOL.dra.mig_class} <= set(rendered)
    ds = k8s_client.AppsV1Api(install.admin).read_namespaced_daemon_set(
        DRA_PLUGIN.workload, install.opts.namespace
    )
    spec = ds.spec.template.spec
    assert spec.node_selector == {PROTOCOL.labels.enable: "true", PROTOCOL.labels.device_api: "dra"}
    host_paths = sorted(v.host_path.path for v in spec.volumes if v.host_path)
    assert host_paths == [
        "/run/amp/eKitC/xdm/sockets",
        "/var/lib/kubelet/plugins/dra.lingjun.com",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
    ]
    container = spec.containers[0]
    assert container.command == ["lj-dra-plugin"]
    assert "--node-name=$(NODE_NAME)" in container.args
    assert container.security_context.privileged is False


def test_the_node_label_chooses_the_dra_plugin_or_the_device_plugin(install: Install) -> None:
    """The DaemonSet controller makes the DRA plugin's pod only for the node labelled dra, the
    Device Plugin's only for the other, the Exporter's for both (the control plane has these
    two nodes only): each pod's node term names its node."""
    names = ProtocolNames.from_protocol(PROTOCOL)
    nodes = NodeFactory(install.admin, group=install.opts.namespace, names=names)
    ns = install.opts.namespace
    dra_node, plugin_node = f"{ns}-dra", f"{ns}-dp"
    agents = {
        DRA_PLUGIN: [dra_node],
        BY_NAME["device-plugin"]: [plugin_node],
        BY_NAME["exporter"]: [dra_node, plugin_node],
    }
    apps = k8s_client.AppsV1Api(install.admin)
    core = k8s_client.CoreV1Api(install.admin)

    selector = "app in (" + ",".join(agent.app for agent in agents) + ")"

    def target(pod: Any) -> str:
        """The node the DaemonSet controller made the pod for (its matchFields term)."""
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        (field,) = terms.node_selector_terms[0].match_fields
        assert (field.key, field.operator) == ("metadata.name", "In")
        (node,) = field.values
        return str(node)

    def placed() -> dict[str, list[str]] | None:
        for agent, want in agents.items():
            status = apps.read_namespaced_daemon_set(agent.workload, ns).status
            if (status.desired_number_scheduled, status.current_number_scheduled) != (
                len(want),
                len(want),
            ):
                return None
        where: dict[str, list[str]] = {}
        for pod in core.list_namespaced_pod(ns, label_selector=selector).items:
            where.setdefault(pod.metadata.labels["app"], []).append(target(pod))
        return {app: sorted(nodes) for app, nodes in where.items()}

    def statuses() -> object:
        return [
            (agent.name, apps.read_namespaced_daemon_set(agent.workload, ns).status.to_dict())
            for agent in agents
        ]

    try:
        nodes.create(dra_node, labels={PROTOCOL.labels.device_api: DRA_MODE})
        nodes.create(plugin_node)
        where = wait_for(placed, 60, "every node agent's pods", describe=statuses)
        assert where == {agent.app: sorted(want) for agent, want in agents.items()}
    finally:
        nodes.cleanup()


@pytest.fixture
def other_slice(install: Install) -> Iterator[str]:
    """Another node's slice of our driver, made by the admin."""
    name = f"other-{secrets.token_hex(3)}"
    custom(install.admin).create_cluster_custom_object(
        *RESOURCE, "resourceslices", resource_slice(name, "node-b")
    )
    yield name
    custom(install.admin).delete_cluster_custom_object(*RESOURCE, "resourceslices", name)


def test_the_plugin_writes_its_own_nodes_slices_only(install: Install, other_slice: str) -> None:
    own = install.as_plugin("node-a")
    slices = custom(own)
    name = f"own-{secrets.token_hex(3)}"
    # Its own node's slice: created, updated (devices), patched, read, deleted.
    created = slices.create_cluster_custom_object(
        *RESOURCE, "resourceslices", resource_slice(name, "node-a")
    )
    created["spec"]["devices"].append({"name": "gpu-1"})
    slices.replace_cluster_custom_object(*RESOURCE, "resourceslices", name, created)
    slices.patch_cluster_custom_object(
        *RESOURCE, "resourceslices", name, {"metadata": {"labels": {"a": "b"}}}
    )
    got = slices.get_cluster_custom_object(*RESOURCE, "resourceslices", name)
    assert [d["name"] for d in got["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert slices.list_cluster_custom_object(*RESOURCE, "resourceslices")["items"]

    # Moving it to another node or driver: the API server keeps both (immutable).
    for field, value in (("nodeName", "node-b"), ("driver", "gpu.example.com")):
        moved = dict(got, spec=dict(got["spec"], **{field: value}))
        message = refusal(
            lambda moved=moved: slices.replace_cluster_custom_object(
                *RESOURCE, "resourceslices", name, moved
            )
        )
        assert f"spec.{field}: Invalid value" in message
        assert "field is immutable" in message
    slices.delete_cluster_custom_object(*RESOURCE, "resourceslices", name)

    # Another node's slice: not created, updated nor deleted; the message names both nodes.
    message = refusal(
        lambda: slices.create_cluster_custom_object(
            *RESOURCE, "resourceslices", resource_slice(f"x-{name}", "node-b")
        )
    )
    assert f"{POLICY_SAYS}: the ResourceSlice of node node-b (its own: node-a)" in message
    theirs = slices.get_cluster_custom_object(*RESOURCE, "resourceslices", other_slice)
    theirs["spec"]["devices"] = []
    assert "of node node-b" in refusal(
        lambda: slices.replace_cluster_custom_object(
            *RESOURCE, "resourceslices", other_slice, theirs
        )
    )
    assert "of node node-b" in refusal(
        lambda: slices.delete_cluster_custom_object(*RESOURCE, "resourceslices", other_slice)
    )
    # Another driver's slice on its own node.
    message = refusal(
        lambda: slices.create_cluster_custom_object(
            *RESOURCE, "resourceslices", resource_slice(f"y-{name}", "node-a", "gpu.example.com")
        )
    )
    assert f"{POLICY_SAYS}: the ResourceSlice of driver gpu.example.com" in message
    # A token without a node writes none.
    message = refusal(
        lambda: custom(install.as_plugin(None)).create_cluster_custom_object(
            *RESOURCE, "resourceslices", resource_slice(f"z-{name}", "node-a")
        )
    )
    assert "its token carries no node name" in message
    # RBAC: no deletecollection.
    assert "cannot deletecollection" in refusal(
        lambda: slices.delete_collection_cluster_custom_object(*RESOURCE, "resourceslices")
    )
    assert custom(install.admin).get_cluster_custom_object(
        *RESOURCE, "resourceslices", other_slice
    )["spec"]["devices"] == [{"name": "gpu-0"}]


def test_the_plugin_reads_claims_and_writes_nothing_else(install: Install) -> None:
    ns = install.opts.namespace
    claim = {
        "apiVersion": "/".join(RESOURCE),
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{secrets.token_hex(3)}", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": PROTOCOL.dra.whole_class("gpu")},
                    }
                ]
            }
        },
    }
    custom(install.admin).create_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim)
    name = claim["metadata"]["name"]
    claim_at = (*RESOURCE, ns, "resourceclaims")
    plugin = install.as_plugin("node-a")
    claims = custom(plugin)
    got = claims.get_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", name)
    assert got["metadata"]["uid"]
    core = k8s_client.CoreV1Api(plugin)
    status = {"status": {}}
    forbidden: list[tuple[str, str, Callable[[], Any]]] = [
        ("list", "resourceclaims", lambda: claims.list_namespaced_custom_object(*claim_at)),
        (
            "update",
            "resourceclaims",
            lambda: claims.replace_namespaced_custom_object(*claim_at, name, got),
        ),
        (
            "patch",
            "resourceclaims/status",
            lambda: claims.patch_namespaced_custom_object_status(*claim_at, name, status),
        ),
        (
            "delete",
            "resourceclaims",
            lambda: claims.delete_namespaced_custom_object(*claim_at, name),
        ),
        ("patch", "nodes", lambda: core.patch_node("node-a", {"metadata": {"labels": {"a": "b"}}})),
        ("list", "pods", lambda: core.list_namespaced_pod(ns)),
        (
            "create",
            "deviceclasses",
            lambda: claims.create_cluster_custom_object(
                *RESOURCE, "deviceclasses", {"metadata": {"name": "x"}, "spec": {}}
            ),
        ),
    ]
    for verb, resource, call in forbidden:
        assert f'cannot {verb} resource "{resource}"' in refusal(call), (verb, resource)
    # Its Node, for the slices' owner reference (get only; a missing one is a 404, not 403).
    with pytest.raises(ApiException) as missing:
        core.read_node("node-a")
    assert missing.value.status == 404


def _helm_classes(*args: str) -> list[dict[str, Any]]:
    """The DeviceClasses of `helm template` with DRA mode and `args`, in render order, less
    the chart's standard labels."""
    rendered = template("--kube-version", "1.34.0", "--set", "dra.enabled=true", *args)
    return [o for o in unhelmed(rendered).values() if o["kind"] == "DeviceClass"]


def test_the_chart_renders_the_dra_objects() -> None:
    """`dra.enabled` adds deploy/draplugin's objects, the rest unchanged;
    `dra.extendedResources` names the extended resources, a MIG class per `dra.migProfiles`
    (default: the same list as lj-deploy's); below 1.34 it refuses in one line."""
    args = ("--namespace", "kube-system", "--kube-version", "1.34.0")
    rendered = unhelmed(template(*args, "--set", "dra.enabled=true"))
    everything = ("common", "deviceplugin", "scheduler", "exporter", "controller")
    assert rendered == plain(*everything, DRA_PLUGIN.directory)
    assert unhelmed(template(*args)) == plain(*everything)
    extended = dataclasses.replace(OPTS, dra_extended_resources=True)
    assert _helm_classes("--set", "dra.extendedResources=true") == manifests.device_classes(
        extended
    )
    chosen = ("1g.10gb", "3g.40gb")
    helm = _helm_classes(
        "--set", "dra.extendedResources=true", "--set-json", f"dra.migProfiles={json.dumps(chosen)}"
    )
    python = manifests.device_classes(dataclasses.replace(extended, dra_mig_profiles=chosen))
    assert helm == python
    assert [c["metadata"]["name"] for c in helm[-2:]] == [
        f"mig-1g.10gb.{DRIVER}",
        f"mig-3g.40gb.{DRIVER}",
    ]
    none = _helm_classes("--set", "dra.extendedResources=true", "--set-json", "dra.migProfiles=[]")
    assert none == manifests.device_classes(dataclasses.replace(extended, dra_mig_profiles=()))
    # migProfiles alone maps nothing: the plain classes.
    assert _helm_classes("--set-json", f"dra.migProfiles={json.dumps(chosen)}") == (
        manifests.device_classes(OPTS)
    )
    old = subprocess.run(
        [
            tool("helm"),
            "template",
            "lj",
            str(ROOT / "deploy/helm/lj-runtimekit"),
            "--kube-version",
            "1.33.0",
            "--set",
            "dra.enabled=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert old.returncode != 0
    assert "dra.enabled: Kubernetes v1.33.0 is older than 1.34" in old.stderr
    # The generated plain files are what manifests renders for DRA mode.
    files = manifests.dra_files(OPTS)
    for name, docs in files.items():
        path = ROOT / "deploy" / DRA_PLUGIN.directory / name
        assert [d for d in yaml.safe_load_all(path.read_text()) if d] == docs


@pytest.mark.parametrize(
    ("profiles", "message"),
    [
        ('["1g.10gb","1G.10GB"]', "at '/dra/migProfiles/1': '1G.10GB' does not match pattern"),
        ('["3g.40gb","3g.40gb"]', "at '/dra/migProfiles': items at 0 and 1 are equal"),
    ],
)
def test_the_chart_refuses_a_bad_mig_profile(profiles: str, message: str) -> None:
    argv = [
        tool("helm"),
        "template",
        "lj",
        str(ROOT / "deploy/helm/lj-runtimekit"),
        "--kube-version",
        "1.34.0",
        "--set",
        "dra.enabled=true,dra.extendedResources=true",
        "--set-json",
        f"dra.migProfiles={profiles}",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr


def _render_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str], str]:
    """`lj-deploy render` of the DRA objects with `args`: exit code, the DeviceClasses'
    names, stderr."""
    out = tmp_path / "rendered.yaml"
    code = cli.main(
        [
            "render",
            f"--protocol={ROOT / 'deploy/protocol.yaml'}",
            f"--version={OPTS.version}",
            "--components=exporter",
            f"--output={out}",
            *args,
        ]
    )
    err = capsys.readouterr().err
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d] if code == 0 else []
    return code, [d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"], err


def test_lj_deploy_maps_the_mig_profiles_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dra-mig-profiles chooses the MIG classes of --dra-extended-resources (default the
    documented list, empty none); a bad profile or the option alone is refused, named."""
    plain_names = [c["metadata"]["name"] for c in manifests.device_classes(OPTS)]
    extended = ("--dra", "--dra-extended-resources")
    code, names, _ = _render_classes(tmp_path, capsys, *extended)
    assert code == 0
    assert names == plain_names + [PROTOCOL.dra.mig_profile_class(p) for p in KNOWN_MIG_PROFILES]
    code, names, _ = _render_classes(
        tmp_path, capsys, *extended, "--dra-mig-profiles=1g.10gb,7g.141gb"
    )
    assert code == 0
    assert names == [*plain_names, f"mig-1g.10gb.{DRIVER}", f"mig-7g.141gb.{DRIVER}"]
    code, names, _ = _render_classes(tmp_path, capsys, *extended, "--dra-mig-profiles=")
    assert (code, names) == (0, plain_names)
    code, _, err = _render_classes(tmp_path, capsys, "--dra", "--dra-mig-profiles=1g.10gb")
    assert code == 1
    assert err == "error: --dra-mig-profiles=1g.10gb: only with --dra-extended-resources\n"
    code, _, err = _render_classes(tmp_path, capsys, *extended, "--dra-mig-profiles=1g.10gb,1g")
    assert code == 1
    assert err == (
        "error: --dra-mig-profiles: MIG profile '1g' is not a profile name like 1g.10gb"
        " (<compute slices>g.<memory GB>gb)\n"
    )


# -- deploy-all.sh: precheck, verify, delete -------------------------------------------------------

SCRIPT = ROOT / "deploy" / "deploy-all.sh"


def deploy_all(
    cp: ControlPlane, tmp: Path, *args: str, namespace: str = "lj-dra-script"
) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        KUBECTL=str(find_tools(("kubectl",), cp.config.version)["kubectl"]),  # its release
        KUBECONFIG=str(cp.kubeconfig_path),
        LJ_DEPLOY_LOG_DIR=str(tmp / "logs"),
    )
    argv = [
        "bash",
        str(SCRIPT),
        *args,
        f"--namespace={namespace}",
        f"--jobs-namespace={namespace}-jobs",
        "--timeout=60s",
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)


def said(out: str) -> list[str]:
    """deploy-all.sh's lines without their time and command prefix."""
    return [line.split("] ", 1)[-1] for line in out.splitlines()]


def test_precheck_says_dra_mode_is_served_and_names_a_node_labelled_without_dra(
    install: Install, tmp_path: Path
) -> None:
    out = deploy_all(install.cp, tmp_path, "precheck", "--dra").stdout
    assert (
        f"ok      DRA mode (--dra): Kubernetes {DRA_VERSION} serves resource.k8s.io/v1 with the"
        " DRA gates" in said(out)
    ), out
    nodes = NodeFactory(install.admin, group="precheck")
    try:
        nodes.create("dra-precheck", wait=False, labels={PROTOCOL.labels.device_api: DRA_MODE})
        out = deploy_all(install.cp, tmp_path, "precheck").stdout
    finally:
        nodes.cleanup()
    problems = [line for line in said(out) if "DRA" in line or "--dra" in line]
    assert problems == [
        f"PROBLEM node(s) dra-precheck are labelled {PROTOCOL.labels.device_api}=dra, but --dra"
        " is not given: they run neither the Device Plugin nor the DRA plugin; fix: deploy"
        " with --dra"
    ], out


def test_precheck_names_the_missing_dra_gates_in_one_line(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """On the same release without the alpha DRA gates the probe's fields are dropped."""
    result = deploy_all(control_plane, tmp_path, "precheck", "--dra")
    assert result.returncode == 1
    lines = [line for line in said(result.stdout) if "DRA mode" in line]
    assert lines == [
        "PROBLEM DRA mode (--dra): the API server drops the fields of the feature gate(s)"
        " DRAConsumableCapacity DRADeviceTaints DRAExtendedResource DRAPartitionableDevices"
        " (TDM shares, MIG counters, device taints, extended resources); fix: start"
        " kube-apiserver, kube-controller-manager and kube-scheduler with --feature-gates="
        "DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=true,"
        "DRAPartitionableDevices=true"
    ], result.stdout


def _node(name: str, *, dra: bool) -> dict[str, Any]:
    labels = {PROTOCOL.labels.enable: "true"}
    if dra:
        labels[PROTOCOL.labels.device_api] = DRA_MODE
    return {"metadata": {"name": name, "labels": labels}}


def test_verify_checks_the_classes_and_each_dra_nodes_slices() -> None:
    """Pure logic over the snapshot: classes present, a slice per DRA node."""
    want = [c["metadata"]["name"] for c in manifests.device_classes(OPTS)]
    classes = [{"metadata": {"name": name}} for name in want]
    nodes = [_node("a", dra=True), _node("b", dra=True), _node("c", dra=False)]
    slices = [resource_slice("s1", "a"), resource_slice("s2", "c")]
    ds = {
        "kind": "DaemonSet",
        "metadata": {"name": DRA_PLUGIN.workload},
        "status": {"desiredNumberScheduled": 2, "numberReady": 2},
    }
    report = verify.check_dra([ds], [], nodes, classes[1:], slices, want, PROTOCOL, "ns")
    assert report.problems == [
        f"dra-plugin: DeviceClass(es) {want[0]} missing; fix: deploy-all.sh deploy --dra",
        f"dra-plugin: node b ({PROTOCOL.labels.device_api}=dra) publishes no ResourceSlice of"
        f" driver {DRIVER}; fix: read its DRA plugin's log (kubectl -n ns get pods"
        f" -l app={DRA_PLUGIN.app} --field-selector spec.nodeName=b, then kubectl logs)",
    ]
    assert f"dra-plugin: node a publishes 1 device(s) of {DRIVER}" in report.ok
    assert any("nodes not in DRA mode: c" in line for line in report.info)
    report = verify.check_dra([ds], [], nodes[2:], classes, [], want, PROTOCOL, "ns")
    assert report.problems == []
    assert "runs nowhere" in report.info[0]


def test_deploy_and_verify_with_dra(install: Install, tmp_path: Path) -> None:
    """deploy --dra applies the DRA objects beside a component and waits for the DRA plugin's
    rollout; status --dra lists it; verify --dra checks the classes and says no node is in DRA
    mode."""
    ns = install.opts.namespace
    result = deploy_all(
        install.cp,
        tmp_path,
        "deploy",
        "--dra",
        "--components=exporter",
        "--overwrite-config",
        namespace=ns,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'daemon set "{DRA_PLUGIN.workload}" successfully rolled out' in result.stdout
    status = deploy_all(
        install.cp, tmp_path, "status", "--dra", "--components=exporter", namespace=ns
    ).stdout
    assert f"dra-plugin           {DRA_PLUGIN.resource}: 0/0 ready" in status, status
    result = deploy_all(
        install.cp, tmp_path, "verify", "--dra", "--components=exporter", namespace=ns
    )
    lines = said(result.stdout)
    count = len(manifests.device_classes(install.opts))  # the module's install: a superset
    assert f"ok      dra-plugin: {count} DeviceClass(es) of driver {DRIVER}" in lines, result.stdout
    assert any(
        line.startswith("info    dra-plugin: no enabled node is labelled") for line in lines
    ), result.stdout


def test_delete_removes_the_dra_objects_and_the_drivers_slices(
    install: Install, tmp_path: Path
) -> None:
    """Last in this module: delete (DRA mode found by its DeviceClasses, no --dra) removes
    the DeviceClasses, the DRA plugin and our driver's ResourceSlices; another driver's stay."""
    admin = custom(install.admin)
    for name, node, driver in (
        ("ours-a", "node-a", DRIVER),
        ("ours-b", "node-b", DRIVER),
        ("theirs", "node-a", "gpu.example.com"),
    ):
        admin.create_cluster_custom_object(
            *RESOURCE, "resourceslices", resource_slice(name, node, driver)
        )
    result = deploy_all(
        install.cp,
        tmp_path,
        "delete",
        "--components=device-plugin",
        namespace=install.opts.namespace,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DRA mode is installed (its DeviceClasses exist): deleting it too" in result.stdout
    left = admin.list_cluster_custom_object(*RESOURCE, "resourceslices")["items"]
    assert [s["metadata"]["name"] for s in left] == ["theirs"]
    assert not admin.list_cluster_custom_object(*RESOURCE, "deviceclasses")["items"]
    with pytest.raises(ApiException) as gone:
        k8s_client.AppsV1Api(install.admin).read_namespaced_daemon_set(
            DRA_PLUGIN.workload, install.opts.namespace
        )
    assert gone.value.status == 404
    # The other components stay.
    k8s_client.AppsV1Api(install.admin).read_namespaced_daemon_set(
        BY_NAME["exporter"].workload, install.opts.namespace
    )


def test_the_daemonsets_command_line_parses_with_the_dra_plugins_flags() -> None:
    try:
        module = importlib.import_module("lj_runtimekit.deviceplugin.cmd.dra_plugin.main")
    except ImportError as exc:  # the component is not in this tree yet
        pytest.skip(f"lj-dra-plugin is not installed: {exc}")
    container = manifests.workload(DRA_PLUGIN, OPTS)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["lj-dra-plugin"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        container["env"]
    )
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["args"]]
    parser = module._parser()
    ns = vars(parser.parse_args(args))
    assert ns["node_name"] == "gpu-node-1"
    assert ns["kubelet_dir"] == "/var/lib/kubelet"
    assert ns["cdi_dir"] == "/var/run/cdi"
    assert ns["state_dir"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert ns["runtime_socket"] == "/run/amp/eKitC/xdm/sockets/runtime.sock"
    mirrored = re.findall(r"\(env ([A-Z0-9_]+)", " ".join(parser.format_help().split()))
    for setting in manifests.SETTINGS[DRA_PLUGIN.name]:
        assert setting.env in mirrored, f"lj-dra-plugin reads no {setting.env}"
