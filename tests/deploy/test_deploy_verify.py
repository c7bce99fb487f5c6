"""The checks behind `deploy-all.sh verify` on Kubernetes objects as kubectl prints them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit.deploy import verify
from lj_runtimekit.deploy.components import BY_NAME, CHECKSUM_ANNOTATION, COMPONENTS, Component
from lj_runtimekit.deploy.manifests import config_checksum
from lj_runtimekit.proto.pkg import protocolinfo
from lj_runtimekit.proto.pkg.protocol import DEFAULTS, Protocol, load_protocol
from lj_runtimekit.proto.pkg.protocol.constants import parse_protocol

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = load_protocol()


def load_protocol_text(text: str) -> Protocol:
    return parse_protocol(yaml.safe_load(text), "test")


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


def test_a_renamed_core_resource_is_what_the_problem_names() -> None:
    # resources.core renamed; the node (no device-mode label) still has the old core units.
    renamed = load_protocol_text("resources.core: example.com/gpu-core\n")
    tdm = node("tdm", gpu_labels(8, None), {GPU: "8", CORE: "800", MEM: "800"})
    (problem,) = verify.check_nodes([tdm], renamed).problems
    assert "capacity example.com/gpu-core=<none> (want 800)" in problem
    assert MEM not in problem


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


def test_configmaps_that_disagree_are_reported_key_by_key() -> None:
    dp, sched, exp = (BY_NAME[n] for n in ("device-plugin", "scheduler-framework", "exporter"))
    cms = [
        configmap(dp.configmap, "resources.gpu: alibabacloud.com/gpu\n"),
        configmap(sched.configmap, "resources.gpu: example.com/gpu\n"),
        configmap(exp.configmap, "labels.enable: gpu_enable\nresources.gpu: example.com/gpu\n"),
    ]
    problems = verify.check_configmaps(
        cms, PROTOCOL, "deploy/protocol.yaml", PROTOCOL_COMPONENTS, "ns"
    ).problems
    assert problems == [
        "protocol ConfigMaps disagree: labels.enable: device-plugin=lj_runtimekit_enable,"
        " scheduler-framework=lj_runtimekit_enable, exporter=gpu_enable",
        "protocol ConfigMaps disagree: resources.gpu: device-plugin=alibabacloud.com/gpu,"
        " scheduler-framework=example.com/gpu, exporter=example.com/gpu",
        "2 protocol key(s) differ between the ConfigMaps; fix: give them the same protocol.yaml"
        " (kubectl -n ns edit configmap lj-runtimekit-device-plugin-config"
        " lj-runtimekit-scheduler-framework-config lj-runtimekit-exporter-config), then"
        " kubectl -n ns rollout restart ds/lj-runtimekit-device-plugin-ds"
        " deploy/lj-runtimekit-scheduler-framework ds/lj-runtimekit-exporter-ds",
    ]


def test_configmaps_edited_alike_pass_and_the_source_difference_is_information() -> None:
    text = "annotations.gpu_policy: example.com/gpu-policy\n"
    cms = [configmap(c.configmap, text) for c in PROTOCOL_COMPONENTS]
    report = verify.check_configmaps(
        cms, PROTOCOL, "deploy/protocol.yaml", PROTOCOL_COMPONENTS, "ns"
    )
    assert report.problems == []
    assert report.ok[0].startswith(
        "protocol ConfigMaps agree: device-plugin, scheduler-framework, exporter (sha256 "
    )
    assert report.info == [
        "the live protocol differs from deploy/protocol.yaml:"
        " annotations.gpu_policy=example.com/gpu-policy"
        " (deploy/protocol.yaml: lingjun.com/gpu-policy)"
        " (the ConfigMaps are what runs; deploy asks before replacing them)"
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


EDITED = "annotations.gpu_policy: example.com/gpu-policy\n"
EDITED_SHA = protocolinfo.protocol_sha256(
    load_protocol_text(EDITED)  # the hash the components compute from the same file
)
DEFAULT_SHA = protocolinfo.protocol_sha256(PROTOCOL)


def workload(component: Component, data: dict[str, str], **spec: Any) -> Any:
    return {
        "kind": component.kind,
        "metadata": {"name": component.workload},
        "spec": {
            "template": {
                "metadata": {
                    "labels": {"app": component.app},
                    "annotations": {CHECKSUM_ANNOTATION: config_checksum(data)},
                },
                "spec": spec,
            }
        },
    }


def running(app: str, name: str, node_name: str, started: str = "2026-01-01T00:00:10Z") -> Any:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node_name},
        "status": {"phase": "Running", "startTime": started},
    }


def metrics_text(sha: str) -> str:
    return (
        f"# HELP {protocolinfo.METRIC} x\n# TYPE {protocolinfo.METRIC} gauge\n"
        f'{protocolinfo.METRIC}{{sha256="{sha}"}} 1.0\n'
    )


def test_pods_running_another_protocol_than_their_configmap_are_named() -> None:
    dp, sched, exp = (BY_NAME[n] for n in ("device-plugin", "scheduler-framework", "exporter"))
    old = {"protocol.yaml": ""}  # what deploy rendered: the pod templates' checksum
    cms = [configmap(c.configmap, EDITED) for c in (dp, sched, exp)]
    workloads = [workload(c, old) for c in (dp, sched, exp)]
    pods = [
        running(dp.app, "dp-a", "n1"),
        running(dp.app, "dp-b", "n2"),
        running(sched.app, "sched", "n1"),
        running(exp.app, "exp-a", "n1"),
        running(exp.app, "exp-b", "n2"),
    ]
    nodes = [
        {"metadata": {"name": "n1", "annotations": {protocolinfo.NODE_ANNOTATION: EDITED_SHA}}},
        {"metadata": {"name": "n2", "annotations": {protocolinfo.NODE_ANNOTATION: DEFAULT_SHA}}},
    ]
    metrics = {"sched": metrics_text(EDITED_SHA), "exp-a": metrics_text(DEFAULT_SHA)}
    report, named = verify.check_running_protocol(
        [dp, sched, exp], workloads, cms, pods, nodes, metrics, "ns"
    )
    assert named == {"dp-b", "exp-a", "exp-b"}
    assert report.problems == [
        f"device-plugin: pod(s) ns/dp-b (sha256 {DEFAULT_SHA[:12]}) run another protocol than"
        f" ConfigMap lj-runtimekit-device-plugin-config (sha256 {EDITED_SHA[:12]});"
        " fix: kubectl -n ns rollout restart ds/lj-runtimekit-device-plugin-ds",
        f"exporter: pod(s) ns/exp-a (sha256 {DEFAULT_SHA[:12]}) run another protocol than"
        f" ConfigMap lj-runtimekit-exporter-config (sha256 {EDITED_SHA[:12]});"
        " fix: kubectl -n ns rollout restart ds/lj-runtimekit-exporter-ds",
        "exporter: pod ns/exp-b reports no protocol (metrics not read) and"
        " lj-runtimekit-exporter-config changed after its pod template was rendered, so what it"
        " runs is unknown; fix: kubectl -n ns rollout restart ds/lj-runtimekit-exporter-ds",
    ]
    assert report.ok == [
        f"device-plugin: 1 pod(s) run the protocol of ConfigMap lj-runtimekit-device-plugin-config"
        f" (sha256 {EDITED_SHA[:12]}): dp-a",
        "scheduler-framework: 1 pod(s) run the protocol of ConfigMap"
        f" lj-runtimekit-scheduler-framework-config (sha256 {EDITED_SHA[:12]}): sched",
    ]
    # Restarted (rollout restart keeps the template): every pod reports the edit; passes.
    nodes[1]["metadata"]["annotations"][protocolinfo.NODE_ANNOTATION] = EDITED_SHA
    metrics = {p: metrics_text(EDITED_SHA) for p in ("sched", "exp-a", "exp-b")}
    report, named = verify.check_running_protocol(
        [dp, sched, exp], workloads, cms, pods, nodes, metrics, "ns"
    )
    assert (report.problems, named) == ([], set())


def test_a_silent_pod_of_an_unchanged_configmap_is_information() -> None:
    exp = BY_NAME["exporter"]
    data = {"protocol.yaml": EDITED}
    report, _ = verify.check_running_protocol(
        [exp],
        [workload(exp, data)],
        [configmap(exp.configmap, EDITED)],
        [running(exp.app, "exp-a", "n1")],
        [],
        {"exp-a": "# HELP a x\n"},
        "ns",
    )
    assert report.problems == []
    assert report.info == [
        f"exporter: pod ns/exp-a reports no protocol (no {protocolinfo.METRIC} in its metrics);"
        " its pod template was rendered with the live ConfigMap"
    ]
    # Edited, then restarted: a silent pod that started after the edit runs it.
    edited = configmap(exp.configmap, EDITED)
    edited["metadata"]["managedFields"] = [
        {"time": "2026-01-01T00:01:00Z", "fieldsV1": {"f:data": {}}}
    ]
    pods = [running(exp.app, "exp-a", "n1", "2026-01-01T00:02:00Z")]
    old = [workload(exp, {})]
    report, _ = verify.check_running_protocol([exp], old, [edited], pods, [], {}, "ns")
    assert report.problems == []
    assert report.info == [
        "exporter: pod ns/exp-a reports no protocol (metrics not read); it started after"
        " lj-runtimekit-exporter-config last changed (2026-01-01T00:01:00Z)"
    ]
    pods = [running(exp.app, "exp-a", "n1", "2026-01-01T00:00:30Z")]
    report, _ = verify.check_running_protocol([exp], old, [edited], pods, [], {}, "ns")
    assert "what it runs is unknown" in report.problems[0]


def test_configmap_edited_around_deploy_is_reported_until_the_pods_restart() -> None:
    ctrl = BY_NAME["controller"]
    data = {"log-level": "INFO"}
    wl = workload(ctrl, data)
    edited = {
        "metadata": {
            "name": ctrl.configmap,
            "managedFields": [
                {
                    "manager": "kubectl-edit",
                    "time": "2026-01-01T00:01:00Z",
                    "fieldsV1": {"f:data": {}},
                },
                {
                    "manager": "history",
                    "time": "2026-01-01T00:05:00Z",
                    "fieldsV1": {"f:metadata": {}},
                },
            ],
        },
        "data": {**data, "log-level": "DEBUG"},
    }
    before = running(ctrl.app, "ctrl-a", "n1", "2026-01-01T00:00:10Z")
    after = running(ctrl.app, "ctrl-b", "n1", "2026-01-01T00:02:00Z")
    cm = {"metadata": {"name": ctrl.configmap}, "data": data}
    assert verify.check_rolled_config([ctrl], [wl], [cm], [before], "ns").problems == []
    problems = verify.check_rolled_config([ctrl], [wl], [edited], [before, after], "ns").problems
    assert problems == [
        "controller: ConfigMap lj-runtimekit-controller-config changed (2026-01-01T00:01:00Z)"
        " after pod(s) ctrl-a started; fix: kubectl -n ns rollout restart"
        " deploy/lj-runtimekit-controller"
    ]
    assert verify.check_rolled_config([ctrl], [wl], [edited], [after], "ns").problems == []
    assert verify.check_rolled_config([ctrl], [wl], [edited], [before], "ns", {"ctrl-a"}) == (
        verify.Report()
    )


def test_values_rendered_from_another_protocol_are_named_with_the_redeploy() -> None:
    dp, ctrl = BY_NAME["device-plugin"], BY_NAME["controller"]
    protocol = load_protocol_text("labels.enable: gpu_on\nresources.ppu: example.com/ppu\n")
    tolerations = [
        {"key": DEFAULTS[k], "operator": "Exists"}
        for k in ("resources.gpu", "resources.ppu", "resources.amd")
    ]
    workloads = [
        workload(dp, {}, nodeSelector={"lj_runtimekit_enable": "true"}, tolerations=tolerations),
        workload(ctrl, {}, containers=[{"args": ["--label-key=lj_runtimekit_enable"]}]),
    ]
    problems = verify.check_baked([dp, ctrl], workloads, protocol, "ns").problems
    fix = "fix: deploy-all.sh deploy --keep-live-config --namespace=ns"
    said = "rendered at deploy time from another protocol, a ConfigMap edit cannot change it"
    assert problems == [
        "device-plugin: DaemonSet ns/lj-runtimekit-device-plugin-ds nodeSelector"
        f" lj_runtimekit_enable=true (labels.enable is gpu_on): {said}; {fix}",
        "device-plugin: DaemonSet ns/lj-runtimekit-device-plugin-ds no toleration of"
        f" example.com/ppu (resources.ppu): {said}; {fix}",
        "controller: Deployment ns/lj-runtimekit-controller --label-key=lj_runtimekit_enable"
        f" (labels.enable is gpu_on): {said}; {fix}",
    ]
    assert verify.check_baked([dp, ctrl], workloads, PROTOCOL, "ns").problems == []


def test_deploy_finds_the_configmaps_edited_since_it_rendered_them_and_keeps_them() -> None:
    dp, exp = BY_NAME["device-plugin"], BY_NAME["exporter"]
    source = (ROOT / "deploy/protocol.yaml").read_text()
    data = {"protocol.yaml": source, "log-level": "INFO"}
    rendered = [
        {
            "kind": "ConfigMap",
            "metadata": {"name": c.configmap, "labels": {"app": c.app}},
            "data": data,
        }
        for c in (dp, exp)
    ] + [workload(c, data) for c in (dp, exp)]
    policy = f"annotations.gpu_policy: {PROTOCOL.annotations.gpu_policy}\n"
    edited = {**data, "protocol.yaml": source.replace(policy, EDITED)}
    live = [
        configmap(dp.configmap, "") | {"data": edited},
        {"metadata": {"name": exp.configmap}, "data": data},
    ]
    workloads = [workload(c, data) for c in (dp, exp)]
    assert verify.edited_configs(live, workloads, rendered, [dp, exp]) == {
        dp.configmap: ["protocol.yaml (annotations.gpu_policy)"]
    }
    # A ConfigMap the last deploy did not render (a new release's protocol.yaml) is no edit.
    assert verify.edited_configs(live, [workload(dp, edited)], rendered, [dp]) == {}
    kept = verify.keep_live_config(rendered, live, [dp.configmap])
    assert kept[0]["data"] == edited
    assert kept[0]["metadata"]["annotations"] == {verify.KEPT_ANNOTATION: "true"}
    assert kept[1]["data"] == data
    template = kept[2]["spec"]["template"]["metadata"]["annotations"]
    assert template[CHECKSUM_ANNOTATION] == config_checksum(edited)
    assert kept[3] == rendered[3]
    # Kept once, asked again while the source differs.
    assert verify.edited_configs([kept[0]], [kept[2]], rendered, [dp]) == {
        dp.configmap: ["protocol.yaml (annotations.gpu_policy)"]
    }


def test_metrics_report_the_protocol_hash() -> None:
    assert protocolinfo.sha256_from_metrics(metrics_text(EDITED_SHA)) == EDITED_SHA
    assert protocolinfo.sha256_from_metrics("# HELP a x\na 1\n") is None
    reordered = load_protocol_text("# a comment\n" + EDITED)
    assert protocolinfo.protocol_sha256(reordered) == EDITED_SHA


def test_an_edit_the_pods_started_on_is_recorded_for_rollback() -> None:
    exp = BY_NAME["exporter"]
    edited = {
        "metadata": {
            "name": exp.configmap,
            "managedFields": [
                {"time": "2026-01-01T00:01:00Z", "fieldsV1": {"f:data": {}}},
            ],
        },
        "data": {"protocol.yaml": EDITED},
    }
    rendered = [{"kind": "ConfigMap", "metadata": {"name": exp.configmap}, "data": {}}]
    running_checksums = {exp.configmap: config_checksum({})}  # the template: never rolled
    before = running(exp.app, "a", "n1", "2026-01-01T00:00:10Z")
    after = running(exp.app, "b", "n2", "2026-01-01T00:02:00Z")
    assert verify.running_edits([edited], [before, after], [exp]) == set()
    assert verify.running_edits([edited], [after], [exp]) == {exp.configmap}
    names = [exp.configmap]
    assert verify.save_previous_config([edited], names, rendered, running_checksums) == {}
    patch = verify.save_previous_config(
        [edited], names, rendered, running_checksums, {exp.configmap}
    )
    recorded = json.loads(
        patch[exp.configmap]["metadata"]["annotations"][verify.PREVIOUS_DATA_ANNOTATION]
    )
    assert recorded == {"protocol.yaml": EDITED}
