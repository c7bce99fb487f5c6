"""The checks behind `deploy-all.sh verify` on Kubernetes objects as kubectl prints them."""

from __future__ import annotations

from typing import Any

from lj_runtimekit.deploy import verify
from lj_runtimekit.deploy.components import BY_NAME, COMPONENTS
from lj_runtimekit.deploy.manifests import config_checksum
from lj_runtimekit.proto.pkg.protocol import DEFAULTS, load_protocol

PROTOCOL = load_protocol()
GPU, CORE, MEM = DEFAULTS["resources.gpu"], DEFAULTS["resources.core"], DEFAULTS["resources.memory"]


def node(name: str, labels: dict[str, str], capacity: dict[str, str], alloc: Any = None) -> Any:
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"capacity": capacity, "allocatable": capacity if alloc is None else alloc},
    }


def gpu_labels(count: int, mode: str | None = "tdm", kind: str = "gpu") -> dict[str, str]:
    labels = {
        "lj_runtimekit_enable": "true",
        "lingjun.com/device-count": str(count),
        "lingjun.com/device-kind": kind,
    }
    if mode:
        labels["lingjun.com/device-mode"] = mode
    return labels


def test_capacity_matching_the_device_count_passes() -> None:
    nodes = [
        node("tdm", gpu_labels(8), {GPU: "8", CORE: "800", MEM: "800"}),
        node("excl", gpu_labels(4, "exclusive"), {GPU: "4", CORE: "0", MEM: "0"}),
        node("ppu", gpu_labels(16, "exclusive", "ppu"), {DEFAULTS["resources.ppu"]: "16"}),
        node("mig", gpu_labels(2, "mig"), {"alibabacloud.com/mig-1g.18gb": "14"}),
        node("cpu", {}, {"cpu": "8"}),
    ]
    report = verify.check_nodes(nodes, PROTOCOL)
    assert report.problems == []
    assert len(report.ok) == 4


def test_capacity_mismatch_and_missing_label_are_named() -> None:
    nodes = [
        node("short", gpu_labels(8), {GPU: "7", CORE: "700", MEM: "800"}),
        node("unlabelled", {"lj_runtimekit_enable": "true"}, {GPU: "8"}),
    ]
    problems = verify.check_nodes(nodes, PROTOCOL).problems
    assert len(problems) == 2
    assert f"node short: lingjun.com/device-count=8 but capacity {GPU}=7 (want 8)" in problems[0]
    assert f"{CORE}=700 (want 800)" in problems[0]
    assert MEM not in problems[0]
    assert "node unlabelled: no lingjun.com/device-count label" in problems[1]


def test_no_enabled_node_says_how_to_label() -> None:
    problems = verify.check_nodes([node("cpu", {}, {})], PROTOCOL).problems
    assert problems == [
        "no node carries lj_runtimekit_enable=true;"
        " fix: kubectl label node <gpu-node> lj_runtimekit_enable=true"
    ]


def test_stale_resource_names_and_cleanup_patch() -> None:
    nodes = [
        node(
            "old",
            gpu_labels(8),
            {GPU: "8", "alibabacloud.com/gpu-mem": "80", "nvidia.com/gpu": "8", "cpu": "8"},
            {GPU: "8", "alibabacloud.com/gpu-mem": "0", "nvidia.com/gpu": "0", "cpu": "8"},
        ),
        # Current names with allocatable 0 (all devices unhealthy) are not stale.
        node("sick", gpu_labels(8), {GPU: "8"}, {GPU: "0"}),
        # A still-advertised resource of a protocol domain is not stale either.
        node("live", gpu_labels(8), {"alibabacloud.com/extra": "2"}),
    ]
    assert verify.stale_resources(nodes, PROTOCOL) == {"old": ["alibabacloud.com/gpu-mem"]}
    assert verify.cleanup_patches(nodes, PROTOCOL) == {
        "old": [
            {"op": "remove", "path": "/status/capacity/alibabacloud.com~1gpu-mem"},
            {"op": "remove", "path": "/status/allocatable/alibabacloud.com~1gpu-mem"},
        ]
    }
    report = verify.stale_report(nodes, PROTOCOL)
    assert report.problems[0].startswith("node old: stale resource(s) alibabacloud.com/gpu-mem")
    assert "deploy-all.sh cleanup-stale-resources" in report.problems[0]


def configmap(name: str, protocol_text: str) -> Any:
    return {"metadata": {"name": name}, "data": {"protocol.yaml": protocol_text}}


PROTOCOL_COMPONENTS = [c for c in COMPONENTS if c.name != "controller"]


def test_configmaps_that_agree_pass() -> None:
    text = "resources.gpu: alibabacloud.com/gpu\n"
    cms = [configmap(c.configmap, text) for c in PROTOCOL_COMPONENTS]
    report = verify.check_configmaps(
        cms, PROTOCOL, "deploy/protocol.yaml", PROTOCOL_COMPONENTS, "ns"
    )
    assert report.problems == []


def test_configmap_drift_is_reported_key_by_key() -> None:
    dp, sched, exp = (BY_NAME[n] for n in ("device-plugin", "scheduler-framework", "exporter"))
    cms = [
        configmap(dp.configmap, ""),
        configmap(sched.configmap, "resources.gpu: example.com/gpu\n"),
        configmap(exp.configmap, "labels.enable: gpu_enable\nresources.gpu: example.com/gpu\n"),
    ]
    problems = verify.check_configmaps(
        cms, PROTOCOL, "deploy/protocol.yaml", PROTOCOL_COMPONENTS, "ns"
    ).problems
    assert problems == [
        "protocol drift: labels.enable: device-plugin=lj_runtimekit_enable,"
        " scheduler-framework=lj_runtimekit_enable, exporter=gpu_enable"
        " (deploy/protocol.yaml: lj_runtimekit_enable)",
        "protocol drift: resources.gpu: device-plugin=alibabacloud.com/gpu,"
        " scheduler-framework=example.com/gpu, exporter=example.com/gpu"
        " (deploy/protocol.yaml: alibabacloud.com/gpu)",
        "2 protocol key(s) drift; fix: deploy-all.sh deploy"
        " --components=device-plugin,scheduler-framework,exporter"
        " (renders every ConfigMap from deploy/protocol.yaml)",
    ]


def test_missing_or_broken_configmaps_are_named() -> None:
    dp, sched = BY_NAME["device-plugin"], BY_NAME["scheduler-framework"]
    cms = [configmap(dp.configmap, "resources.gpu: Not A Name\n")]
    problems = verify.check_configmaps(cms, PROTOCOL, "src", [dp, sched], "kube-system").problems
    assert "key 'resources.gpu'" in problems[0]
    assert "ConfigMap kube-system/lj-runtimekit-device-plugin-config" in problems[0]
    assert problems[1].startswith(
        "scheduler-framework: ConfigMap kube-system/lj-runtimekit-scheduler-framework-config"
        " not found"
    )


def pod(app: str, node_name: str, ready: bool, reason: str | None = None) -> Any:
    status: dict[str, Any] = {
        "phase": "Running" if ready else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if reason:
        status["containerStatuses"] = [{"name": "c", "state": {"waiting": {"reason": reason}}}]
    return {
        "metadata": {"name": f"{app}-{node_name}", "labels": {"app": app}},
        "spec": {"nodeName": node_name},
        "status": status,
    }


def test_workloads_ready_and_not_ready() -> None:
    dp, ctrl = BY_NAME["device-plugin"], BY_NAME["controller"]
    workloads = [
        {
            "kind": "DaemonSet",
            "metadata": {"name": dp.workload},
            "spec": {},
            "status": {"desiredNumberScheduled": 2, "numberReady": 1},
        },
        {
            "kind": "Deployment",
            "metadata": {"name": ctrl.workload},
            "spec": {"replicas": 1},
            "status": {"readyReplicas": 1},
        },
    ]
    pods = [
        pod(dp.app, "n1", True),
        pod(dp.app, "n2", False, "ImagePullBackOff"),
        pod(ctrl.app, "n1", True),
    ]
    report = verify.check_workloads([dp, ctrl], workloads, pods, "kube-system", "enable")
    assert report.ok == ["controller: deploy/lj-runtimekit-controller 1/1 ready"]
    assert report.problems == [
        f"device-plugin: pod kube-system/{dp.app}-n2 on node n2: phase Pending, ready=false"
        f" (c: ImagePullBackOff); fix: kubectl -n kube-system describe pod {dp.app}-n2"
    ]
    missing = verify.check_workloads([BY_NAME["exporter"]], [], [], "ns", "enable").problems
    assert "exporter: ds/lj-runtimekit-exporter-ds not found in namespace ns" in missing[0]


def test_metrics_answer_needs_help_and_type_lines() -> None:
    good = "# HELP a x\n# TYPE a gauge\na 1\n"
    assert verify.check_metrics(good, "pod").problems == []
    assert verify.check_metrics("a 1\n", "pod").problems


def test_configmap_edited_around_deploy_is_reported_until_rolled() -> None:
    exp = BY_NAME["exporter"]
    data = {"protocol.yaml": "", "log-level": "INFO"}
    workload = {
        "kind": "DaemonSet",
        "metadata": {"name": exp.workload},
        "spec": {
            "template": {
                "metadata": {
                    "annotations": {"lj-runtimekit.io/config-checksum": config_checksum(data)}
                }
            }
        },
    }
    cm = {"metadata": {"name": exp.configmap}, "data": data}
    assert verify.check_rolled_config([exp], [workload], [cm]).problems == []
    edited = {"metadata": {"name": exp.configmap}, "data": {**data, "log-level": "DEBUG"}}
    problems = verify.check_rolled_config([exp], [workload], [edited]).problems
    assert problems == [
        "exporter: ConfigMap lj-runtimekit-exporter-config changed after its pods started"
        " (lj-runtimekit.io/config-checksum differs); fix: deploy-all.sh deploy"
        " --components=exporter (renders it from the source and rolls the pods)"
    ]
