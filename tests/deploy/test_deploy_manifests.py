"""The rendered manifests: one source, the naming and security rules, real component flags."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit.deploy import cli, generate, manifests
from lj_runtimekit.deploy.components import (
    BY_NAME,
    CHECKSUM_ANNOTATION,
    COMPONENTS,
    DeployError,
    check_jobs_namespace,
    check_version,
    parse_components,
    parse_image_overrides,
)
from lj_runtimekit.proto.pkg.protocol import DEFAULTS, load_protocol

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VERSION = (ROOT / "VERSION").read_text().strip()


def plain(component_dir: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / component_dir).glob("0*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


CLUSTER_KINDS = (
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def workload_of(component_dir: str) -> dict[str, Any]:
    return next(d for d in plain(component_dir) if d["kind"] in ("DaemonSet", "Deployment"))


def test_protocol_source_equals_the_built_in_defaults() -> None:
    text = (DEPLOY / "protocol.yaml").read_text()
    data = yaml.safe_load(text)
    assert set(data) == set(DEFAULTS), "deploy/protocol.yaml must spell out every key"
    assert load_protocol(DEPLOY / "protocol.yaml").as_flat() == dict(DEFAULTS)


def test_generated_files_are_current() -> None:
    assert generate.generate(DEPLOY, check=True) == [], "run: make -C deploy manifests"


def test_generate_check_fails_on_a_hand_edited_controller_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Controller/config/ is generated too: an edit by hand or a file added by hand fails
    `generate --check`, and `generate` puts the generated files back."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "protocol.yaml").write_text((DEPLOY / "protocol.yaml").read_text())
    (tmp_path / "VERSION").write_text(VERSION + "\n")
    generate.generate(deploy, check=False)
    assert generate.generate(deploy, check=True) == []
    config = tmp_path / "Controller" / "config"
    manager = config / "manager" / "manager.yaml"
    assert manager.read_text() == (ROOT / "Controller/config/manager/manager.yaml").read_text()
    generated = manager.read_text()
    manager.write_text(generated.replace("replicas: 2", "replicas: 3"))
    extra = config / "rbac" / "extra_role.yaml"
    extra.write_text("kind: Role\n")
    assert sorted(generate.generate(deploy, check=True)) == [manager, extra]
    assert cli.main(["generate", "--deploy-dir", str(deploy), "--check"]) == 1
    out = capsys.readouterr().out
    assert "stale Controller/config/manager/manager.yaml" in out
    assert "stale Controller/config/rbac/extra_role.yaml" in out
    generate.generate(deploy, check=False)
    assert manager.read_text() == generated
    assert not extra.exists()
    assert generate.generate(deploy, check=True) == []


def test_generated_yaml_has_no_anchors() -> None:
    """A list used twice (a probe's command, a rule's verbs) is written out each time: no
    `&id001`/`*id001` for a reader or a tool without YAML anchors."""
    files = generate.all_files(DEPLOY)
    assert any(p.name == "03-daemonset.yaml" for p in files)
    for path, text in files.items():
        assert not re.search(r"[&*]id\d{3}\b", text), path
    shared = ["get", "list"]
    assert manifests.to_yaml({"a": shared, "b": shared}) == "a:\n- get\n- list\nb:\n- get\n- list\n"


def test_runtime_class_is_node_k8s_io_v1() -> None:
    """The oldest supported release (1.28) serves node.k8s.io/v1: no v1beta1 fallback."""
    (runtime_class,) = yaml.safe_load_all((DEPLOY / "common" / "runtimeclass.yaml").read_text())
    assert runtime_class["apiVersion"] == "node.k8s.io/v1"
    template = (DEPLOY / "helm/lj-runtimekit/templates/common-runtimeclass.yaml").read_text()
    assert "apiVersion: node.k8s.io/v1\n" in template
    assert "v1beta1" not in (DEPLOY / "deploy-all.sh").read_text()


def test_one_version_drives_images_and_chart() -> None:
    chart = yaml.safe_load((DEPLOY / "helm/lj-runtimekit/Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    assert "v" + chart["version"] == VERSION
    check_version(VERSION, "VERSION")
    for component in COMPONENTS:
        for container in workload_of(component.directory)["spec"]["template"]["spec"]["containers"]:
            assert container["image"].endswith(f":{VERSION}")
    args = workload_of("controller")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert (
        "--job-image=lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit/"
        f"lj-runtimekit-controller-job-agent:{VERSION}" in args
    )


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_names_labels_and_namespace(component: Any) -> None:
    docs = plain(component.directory)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert (component.kind, component.workload) in kinds
    assert ("ConfigMap", component.configmap) in kinds
    assert ("ServiceAccount", component.service_account) in kinds
    for doc in docs:
        labels = doc["metadata"]["labels"]
        if doc["kind"] != "PriorityClass":
            assert labels["app"] == f"lj-runtimekit-{component.name}"
        assert labels["app.kubernetes.io/part-of"] == "lj-runtimekit"
        if doc["metadata"]["name"] == "lj-runtimekit-controller-node-events":
            assert doc["metadata"]["namespace"] == "default"  # events about Nodes live there
        elif doc["kind"] in ("Role", "RoleBinding") and component.name == "controller":
            assert doc["metadata"]["namespace"] == "lj-runtimekit-jobs"  # the Jobs' namespace
        elif doc["metadata"]["name"] == "lj-runtimekit-job-agent":
            assert doc["metadata"]["namespace"] == "lj-runtimekit-jobs"  # beside its pods
        elif doc["kind"] not in CLUSTER_KINDS:
            assert doc["metadata"]["namespace"] == "kube-system"
    workload = workload_of(component.directory)
    assert workload["spec"]["template"]["metadata"]["labels"]["app"] == component.app
    assert workload["spec"]["selector"]["matchLabels"] == {"app": component.app}


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_security_resources_and_probes(component: Any) -> None:
    spec = workload_of(component.directory)["spec"]["template"]["spec"]
    assert not spec.get("hostNetwork")
    assert not spec.get("hostPID")
    assert not spec.get("hostIPC")
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["priorityClassName"]
    container = spec["containers"][0]
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["privileged"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]) == {"requests", "limits"}
    for part in ("requests", "limits"):
        assert set(container["resources"][part]) == {"cpu", "memory"}
    assert "livenessProbe" in container
    assert "readinessProbe" in container
    host_paths = {
        v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v
    }
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    if component.name == "device-plugin":
        assert sorted(host_paths.values()) == [
            "/run/amp/eKitC/xdm/sockets",
            "/var/lib/kubelet/device-plugins",
        ]
        assert mounts["runtime-sockets"]["readOnly"] is True
        assert spec["priorityClassName"] == "system-node-critical"
    elif component.name == "exporter":
        assert sorted(host_paths.values()) == [
            "/run/amp/eKitC/xdm/sockets",
            "/var/lib/kubelet/pod-resources",
        ]
        assert all(m.get("readOnly") for m in mounts.values()), "the exporter only reads"
    else:
        assert host_paths == {}, "no host access for the scheduler and the controller"
        assert ctx["runAsNonRoot"] is True
        assert ctx["runAsUser"] != 0


@pytest.mark.parametrize("name", ["device-plugin", "exporter"])
def test_daemonsets_target_enabled_gpu_nodes_and_tolerate_gpu_taints(name: str) -> None:
    spec = workload_of(BY_NAME[name].directory)["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {DEFAULTS["labels.enable"]: "true"}
    keys = {t["key"] for t in spec["tolerations"]}
    assert {"nvidia.com/gpu", DEFAULTS["resources.gpu"], "CriticalAddonsOnly"} <= keys


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_config_checksum_on_the_pod_template_follows_the_configmap(component: Any) -> None:
    cm = next(d for d in plain(component.directory) if d["kind"] == "ConfigMap")
    annotations = workload_of(component.directory)["spec"]["template"]["metadata"]["annotations"]
    assert annotations[CHECKSUM_ANNOTATION] == manifests.config_checksum(cm["data"])
    opts = manifests.default_options(DEPLOY)
    changed = manifests.Options(
        protocol_text=opts.protocol_text.replace(
            "labels.device_model: lingjun.com/device-model",
            "labels.device_model: example.com/model",
        ),
        version=opts.version,
    )
    rolled = manifests.workload(component, changed)["spec"]["template"]["metadata"]
    if component.name == "controller":  # reads no protocol.yaml
        assert rolled["annotations"][CHECKSUM_ANNOTATION] == annotations[CHECKSUM_ANNOTATION]
    else:
        assert rolled["annotations"][CHECKSUM_ANNOTATION] != annotations[CHECKSUM_ANNOTATION]


def test_protocol_configmaps_carry_the_one_source_text() -> None:
    source = (DEPLOY / "protocol.yaml").read_text()
    for name in ("device-plugin", "scheduler-framework", "exporter"):
        cm = next(d for d in plain(BY_NAME[name].directory) if d["kind"] == "ConfigMap")
        assert cm["data"]["protocol.yaml"] == source


def test_render_options_reach_every_object() -> None:
    opts = manifests.Options(
        protocol_text=(DEPLOY / "protocol.yaml").read_text(),
        version="v2.0.1",
        namespace="gpu-system",
        registry="registry.example.com/lj/",
        images=parse_image_overrides(["exporter=mirror.example.com/exp@sha256:" + "a" * 64]),
    )
    objs = manifests.render(COMPONENTS, opts)
    text = yaml.safe_dump_all(objs)
    assert "kube-system" not in text
    for obj in objs:
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert {s["namespace"] for s in obj["subjects"]} == {"gpu-system"}
    images = {
        c["name"]: c["image"]
        for o in objs
        if o["kind"] in ("DaemonSet", "Deployment")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {
        "device-plugin": "registry.example.com/lj/lj-runtimekit-device-plugin:v2.0.1",
        "scheduler-framework": "registry.example.com/lj/lj-runtimekit-scheduler-framework:v2.0.1",
        "exporter": "mirror.example.com/exp@sha256:" + "a" * 64,
        "controller": "registry.example.com/lj/lj-runtimekit-controller:v2.0.1",
    }
    assert "--job-image=registry.example.com/lj/lj-runtimekit-controller-job-agent:v2.0.1" in text
    # The admission policies name the identities, and the Job Agent image without its tag.
    assert "system:serviceaccount:gpu-system:lj-runtimekit-device-plugin'" in text
    assert "system:serviceaccount:gpu-system:lj-runtimekit-controller'" in text
    policy = next(
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"] == "lj-runtimekit-controller-jobs"
    )
    image_rule = policy["spec"]["validations"][0]["expression"]
    assert "c.image == 'registry.example.com/lj/lj-runtimekit-controller-job-agent'" in image_rule


@pytest.mark.parametrize(
    ("ref", "name"),
    [
        ("r.example.com/lj/agent:v1.2.3", "r.example.com/lj/agent"),
        ("r.example.com:5000/agent", "r.example.com:5000/agent"),
        ("r.example.com:5000/agent:v1@sha256:" + "a" * 64, "r.example.com:5000/agent"),
        ("agent@sha256:" + "a" * 64, "agent"),
    ],
)
def test_image_name_drops_tag_and_digest(ref: str, name: str) -> None:
    assert manifests.image_name(ref) == name


def test_jobs_namespace_kubelet_port_and_admission_options() -> None:
    """The Controller's Jobs, its Lease and the Job Agent's account in the Jobs' namespace;
    the Device Plugin without the kubelet read-only port; no policies (Kubernetes < 1.30)."""
    opts = manifests.Options(
        protocol_text=(DEPLOY / "protocol.yaml").read_text(),
        version=VERSION,
        jobs_namespace="gpu-jobs",
        kubelet_pods_url="",
        admission_policies=False,
    )
    objs = manifests.render(COMPONENTS, opts)
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    namespace = next(o for o in objs if o["kind"] == "Namespace")
    assert namespace["metadata"]["name"] == "gpu-jobs"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    role = next(
        o
        for o in objs
        if o["kind"] == "Role" and o["metadata"]["name"] == "lj-runtimekit-controller"
    )
    assert role["metadata"]["namespace"] == "gpu-jobs"
    workloads = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("DaemonSet", "Deployment")}
    controller = workloads["lj-runtimekit-controller"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "LJ_CONTROLLER_NAMESPACE", "value": "gpu-jobs"} in controller["env"]
    for agent in ("lj-runtimekit-device-plugin-ds", "lj-runtimekit-exporter-ds"):
        container = workloads[agent]["spec"]["template"]["spec"]["containers"][0]
        assert "--kubelet-pods-url=" in container["args"], agent


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: parse_components("device-plugin,gpu-operator"),
            "unknown component 'gpu-operator'",
        ),
        (lambda: check_version("1.15.0"), "is not a version; expected v{major}"),
        (lambda: check_version("v1.15"), "is not a version"),
        (lambda: check_version("v1.15.0-rc1"), "is not a version"),
        (lambda: parse_image_overrides(["nothing"]), "expected <component>=<image reference>"),
        (lambda: parse_image_overrides(["gpu=x:1"]), "unknown image 'gpu'"),
        (lambda: check_jobs_namespace("kube-system"), "the Jobs need a namespace of their own"),
        (lambda: check_jobs_namespace("Jobs"), "--jobs-namespace=Jobs: not a namespace name"),
    ],
)
def test_operator_mistakes_are_named(call: Any, message: str) -> None:
    with pytest.raises(DeployError, match=re.escape(message)):
        call()


# -- the container command lines against the real console scripts' parsers --------------------


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
        self.namespace = namespace
        self.parser = parser


@pytest.fixture
def capture_parse(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stops a console script's main() right after its flags parsed (errors still exit 2)."""
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        namespace, extra = original(self, *a, **kw)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        raise _Parsed(namespace, self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    return


def _environment(container: dict[str, Any], configmap: dict[str, Any]) -> dict[str, str]:
    """The container environment as the kubelet would set it (downward API faked)."""
    fields = {
        "spec.nodeName": "gpu-node-1",
        "status.hostIP": "10.0.0.7",
        "metadata.namespace": "kube-system",
        "metadata.name": "pod-1",
    }
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = item["valueFrom"]["configMapKeyRef"]
            assert ref["name"] == configmap["metadata"]["name"]
            env[item["name"]] = configmap["data"][ref["key"]]
    return env


def _expand(arg: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


MAINS = {
    "lj-device-plugin": "lj_runtimekit.deviceplugin.cmd.device_plugin.main",
    "lj-exporter": "lj_runtimekit.exporter.cmd.exporter.main",
    "lj-scheduler": "lj_runtimekit.schedulerframework.cmd.scheduler.main",
    "lj-controller": "lj_runtimekit.controller.cmd.controller.main",
}


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_container_command_line_parses_with_the_real_flags(
    component: Any, capture_parse: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    docs = plain(component.directory)
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    container = workload_of(component.directory)["spec"]["template"]["spec"]["containers"][0]
    script = container["command"][0]
    try:
        module = importlib.import_module(MAINS[script])
    except ImportError as exc:  # the component is not in this tree yet
        pytest.skip(f"{script} is not installed: {exc}")
    env = _environment(container, cm)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # The ConfigMap's files, where the container mounts them.
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    for key, value in cm["data"].items():
        (config_dir / key).write_text(value)
    args = [
        _expand(a, env).replace("/etc/lj-runtimekit", str(config_dir)) for a in container["args"]
    ]
    with pytest.raises(_Parsed) as parsed:
        module.main(args)
    ns = vars(parsed.value.namespace)
    # Every setting's variable is one a flag of the component mirrors (each env-mirrored
    # flag names its variables in its help: `(env NAME, default ...)`).
    mirrored = set(
        re.findall(
            r"\(env ([A-Z0-9_]+(?: or [A-Z0-9_]+)*),",
            " ".join(parsed.value.parser.format_help().split()),
        )
    )
    names = {n for group in mirrored for n in group.split(" or ")}
    for setting in manifests.SETTINGS[component.name]:
        assert setting.env in names, f"{script} reads no {setting.env}"
    if script == "lj-device-plugin":
        assert ns["kubelet_pods_url"] == "http://10.0.0.7:10255/pods"
        assert ns["node_name"] == "gpu-node-1"
        assert ns["label_node"] is True
        assert load_protocol(ns["protocol_file"]).as_flat() == dict(DEFAULTS)
    elif script == "lj-exporter":
        assert ns["port"] == manifests.METRICS_PORT
        assert ns["node_name"] == "gpu-node-1"
        assert load_protocol(ns["protocol_file"]).as_flat() == dict(DEFAULTS)
    elif script == "lj-scheduler":
        assert ns["lease_namespace"] == "kube-system"
        assert ns["metrics_port"] == manifests.SCHEDULER_METRICS_PORT
        config = importlib.import_module(
            "lj_runtimekit.schedulerframework.internal.config.config"
        ).load_config(ns["config"])
        assert [p.scheduler_name for p in config.profiles] == [manifests.SCHEDULER_NAME]
    else:
        assert ns["namespace"] == "lj-runtimekit-jobs"  # its Jobs and its Lease
        assert ns["label_key"] == DEFAULTS["labels.enable"]
        settings = module.settings_from(parsed.value.namespace)
        assert settings is not None


def test_jobset_is_required_only_when_the_gang_plugin_asks_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = manifests.scheduler_config()
    assert manifests.jobset_required(config) is False
    args = config["profiles"][0]["pluginConfig"][0]["args"]
    args["requireJobSet"] = True
    assert manifests.jobset_required(config) is True
    config["profiles"][0]["plugins"] = {"multiPoint": {"disabled": [{"name": "Coscheduling"}]}}
    assert manifests.jobset_required(config) is False
    del config["profiles"][0]["plugins"]
    args["requireJobSet"] = "yes"
    with pytest.raises(DeployError, match="the scheduler configuration is not valid"):
        manifests.jobset_required(config)
    # Without the Scheduler Framework installed: the explicit pluginConfig.
    monkeypatch.setitem(sys.modules, "lj_runtimekit.schedulerframework.internal.config", None)
    args["requireJobSet"] = True
    assert manifests.jobset_required(config) is True


# -- the extender option ---------------------------------------------------------------------

SCHEDULER = BY_NAME["scheduler-framework"]


def extender_options(**secrets: str) -> manifests.Options:
    return manifests.Options(
        protocol_text=(DEPLOY / "protocol.yaml").read_text(),
        version=VERSION,
        namespace="gpu-system",
        extender=True,
        **(secrets or {"extender_tls_secret": "ext-tls", "extender_client_ca_secret": "ext-ca"}),
    )


def test_extender_option_renders_a_service_and_the_kube_scheduler_configuration() -> None:
    sample = importlib.import_module("lj_runtimekit.schedulerframework.internal.extender.sample")
    opts = extender_options()
    files = manifests.component_files(SCHEDULER, opts)
    service, configmap = files[manifests.EXTENDER_FILE]
    assert service["kind"] == "Service"
    assert service["metadata"] == {
        "name": SCHEDULER.app,
        "namespace": "gpu-system",
        "labels": manifests.labels(SCHEDULER),
    }
    assert service["spec"]["selector"] == {"app": SCHEDULER.app}
    assert service["spec"]["ports"] == [
        {"name": "extender", "port": 8888, "targetPort": "extender", "protocol": "TCP"}
    ]
    text = configmap["data"][manifests.KUBE_SCHEDULER_CONFIG_KEY]
    config = yaml.safe_load(text)
    assert config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://lj-runtimekit-scheduler-framework.gpu-system.svc:8888"
    assert extender["enableHTTPS"] is True
    assert extender["bindVerb"] == "bind"
    assert {"certFile", "keyFile", "caFile"} <= set(extender["tlsConfig"])
    managed = [r["name"] for r in extender["managedResources"]]
    assert managed == sample.managed_resources(opts.protocol)
    assert DEFAULTS["resources.gpu"] in managed
    # The rest is the Scheduler Framework's sample, generated from the same protocol.
    reference = yaml.safe_load(sample.render(opts.protocol))
    reference["extenders"][0]["urlPrefix"] = extender["urlPrefix"]
    assert config == reference
    assert "&id0" not in text


def test_extender_option_changes_the_scheduler_pod_and_narrows_its_rights() -> None:
    opts = extender_options(extender_tls_secret="ext-tls", extender_token_secret="ext-token")
    pod = manifests.workload(SCHEDULER, opts)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][-6:] == [
        "--mode=extender",
        "--extender-address=0.0.0.0",
        "--extender-port=8888",
        "--extender-tls-cert=/etc/lj-runtimekit-extender/extender-tls/tls.crt",
        "--extender-tls-key=/etc/lj-runtimekit-extender/extender-tls/tls.key",
        "--extender-token-file=/etc/lj-runtimekit-extender/extender-token/token",
    ]
    assert {"name": "extender", "containerPort": 8888, "protocol": "TCP"} in container["ports"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"extender-tls": "ext-tls", "extender-token": "ext-token"}
    assert all(m["readOnly"] for m in container["volumeMounts"])
    (role,) = [o for o in manifests.rbac(SCHEDULER, opts) if o["kind"] == "ClusterRole"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {
        *((kind, verb) for kind in ("nodes", "pods") for verb in ("get", "list", "watch")),
        ("pods/binding", "create"),
        *(("events", verb) for verb in ("create", "patch", "update")),
    }
    # The scheduler's own ConfigMap (and so the pod's checksum) is the same in both modes.
    plain_opts = manifests.default_options(DEPLOY)
    assert manifests.config_data(SCHEDULER, opts) == manifests.config_data(SCHEDULER, plain_opts)


def test_the_default_render_has_no_extender() -> None:
    objs = manifests.render(COMPONENTS, manifests.default_options(DEPLOY))
    assert not [o for o in objs if o["kind"] == "Service"]
    assert "--mode=extender" not in yaml.safe_dump_all(objs)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--extender"],
            "--extender: the extender serves beyond loopback only with TLS and an authenticated"
            " caller; give --extender-tls-secret=NAME",
        ),
        (
            ["--extender", "--extender-tls-secret=tls"],
            "--extender: the extender serves beyond loopback only with TLS and an authenticated"
            " caller; give --extender-client-ca-secret=NAME (ca.crt",
        ),
        (
            ["--extender", "--extender-token-secret=t"],
            "--extender: the extender serves beyond loopback only with TLS and an authenticated"
            " caller; give --extender-tls-secret=NAME",
        ),
        (["--extender-tls-secret=tls"], "--extender-tls-secret=tls: only with --extender"),
        (
            ["--extender", "--extender-tls-secret=Tls", "--extender-token-secret=t"],
            "--extender-tls-secret=Tls: not a Secret name",
        ),
    ],
)
def test_extender_render_refuses_without_tls_and_an_authenticated_caller(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["render", f"--protocol={DEPLOY / 'protocol.yaml'}", f"--version={VERSION}", *flags]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: {message}")
    assert captured.err.count("\n") == 1


def test_extender_command_line_parses_with_the_real_flags(
    capture_parse: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        module = importlib.import_module(MAINS["lj-scheduler"])
    except ImportError as exc:
        pytest.skip(f"lj-scheduler is not installed: {exc}")
    opts = extender_options(
        extender_tls_secret="t", extender_client_ca_secret="c", extender_token_secret="k"
    )
    container = manifests.workload(SCHEDULER, opts)["spec"]["template"]["spec"]["containers"][0]
    with pytest.raises(_Parsed) as parsed:
        module.main(container["args"])
    ns = vars(parsed.value.namespace)
    assert ns["mode"] == "extender"
    assert ns["extender_address"] == "0.0.0.0"
    assert ns["extender_port"] == manifests.EXTENDER_PORT
    assert ns["extender_tls_cert"].endswith("/extender-tls/tls.crt")
    assert ns["extender_client_ca"].endswith("/extender-client-ca/ca.crt")
    assert ns["extender_token_file"].endswith("/extender-token/token")
