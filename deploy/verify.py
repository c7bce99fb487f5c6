"""Checks of a live deployment, on JSON that deploy-all.sh fetched with kubectl.

Pure functions over Kubernetes objects (dicts as `kubectl get -o json` writes
them), so each rule is unit-tested without a cluster and the script keeps one
client (kubectl, with the operator's kubeconfig).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lj_runtimekit.deploy.components import (
    BY_NAME,
    CHECKSUM_ANNOTATION,
    DRA_PLUGIN,
    Component,
    DeployError,
)
from lj_runtimekit.deploy.manifests import config_checksum
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import (
    DRA_MODE,
    Protocol,
    ProtocolError,
    parse_protocol_text,
)
from lj_runtimekit.proto.pkg.protocolinfo import (
    METRIC,
    NODE_ANNOTATION,
    protocol_sha256,
    sha256_from_metrics,
)

Obj = Mapping[str, Any]
PROTOCOL_COMPONENTS = ("device-plugin", "scheduler-framework", "exporter")
"""The components that load protocol.yaml from their ConfigMap and report its hash."""
_QUANTITY_RE = re.compile(r"^(\d+)$")


@dataclass
class Report:
    """Lines for the operator: `ok` ones and `problems` (each says what to fix)."""

    ok: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    """Worth knowing, never a failure."""

    def extend(self, other: Report) -> None:
        self.ok += other.ok
        self.problems += other.problems
        self.info += other.info


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", "?"))


def _labels(obj: Obj) -> Mapping[str, str]:
    labels: Mapping[str, str] = obj.get("metadata", {}).get("labels") or {}
    return labels


def _int(value: object) -> int | None:
    match = _QUANTITY_RE.match(str(value)) if value is not None else None
    return int(match.group(1)) if match else None


# -- pods and workloads ----------------------------------------------------------------------


def _pod_problem(pod: Obj) -> str | None:
    status = pod.get("status", {})
    phase = status.get("phase", "Unknown")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if phase == "Running" and ready:
        return None
    reasons = []
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        for key in ("waiting", "terminated"):
            if key in state and state[key].get("reason"):
                reasons.append(f"{cs.get('name')}: {state[key]['reason']}")
    detail = f" ({'; '.join(reasons)})" if reasons else ""
    return f"phase {phase}, ready={str(ready).lower()}{detail}"


def check_workloads(
    components: Iterable[Component],
    workloads: Iterable[Obj],
    pods: Iterable[Obj],
    namespace: str,
    enable_label: str,
) -> Report:
    """Every chosen component's workload exists, is rolled out, and its pods are Running+Ready."""
    report = Report()
    by_key = {(w.get("kind"), _name(w)): w for w in workloads}
    pods = list(pods)
    for component in components:
        workload = by_key.get((component.kind, component.workload))
        if workload is None:
            report.problems.append(
                f"{component.name}: {component.resource} not found in namespace {namespace};"
                f" fix: deploy-all.sh deploy --components={component.name}"
                f" --namespace={namespace}"
            )
            continue
        status = workload.get("status") or {}
        if component.kind == "DaemonSet":
            desired = int(status.get("desiredNumberScheduled") or 0)
            ready = int(status.get("numberReady") or 0)
            if desired == 0:
                report.problems.append(
                    f"{component.name}: {component.resource} runs on no node: no node carries"
                    f" {enable_label}=true; fix: kubectl label node <gpu-node> {enable_label}=true"
                )
                continue
        else:
            desired = int((workload.get("spec") or {}).get("replicas", 1))
            ready = int(status.get("readyReplicas") or 0)
        mine = [p for p in pods if _labels(p).get("app") == component.app]
        bad = [(p, problem) for p in mine if (problem := _pod_problem(p)) is not None]
        for pod, problem in bad:
            node = pod.get("spec", {}).get("nodeName") or "<unscheduled>"
            report.problems.append(
                f"{component.name}: pod {namespace}/{_name(pod)} on node {node}: {problem};"
                f" fix: kubectl -n {namespace} describe pod {_name(pod)}"
            )
        if ready < desired and not bad:
            report.problems.append(
                f"{component.name}: {component.resource} {ready}/{desired} ready;"
                f" fix: kubectl -n {namespace} rollout status {component.resource}"
            )
        if ready >= desired and not bad:
            nodes = sorted({p.get("spec", {}).get("nodeName") or "?" for p in mine})
            where = f" on {', '.join(nodes)}" if component.kind == "DaemonSet" else ""
            report.ok.append(
                f"{component.name}: {component.resource} {ready}/{desired} ready{where}"
            )
    return report


def status_lines(
    components: Iterable[Component], workloads: Iterable[Obj], pods: Iterable[Obj]
) -> list[str]:
    """One line per component and per pod: what `deploy-all.sh status` prints."""
    by_key = {(w.get("kind"), _name(w)): w for w in workloads}
    pods = list(pods)
    lines: list[str] = []
    for component in components:
        workload = by_key.get((component.kind, component.workload))
        if workload is None:
            lines.append(f"{component.name:<20} {component.resource}: not deployed")
            continue
        status = workload.get("status") or {}
        if component.kind == "DaemonSet":
            counts = (
                f"{status.get('numberReady', 0)}/{status.get('desiredNumberScheduled', 0)} ready"
            )
        else:
            counts = f"{status.get('readyReplicas', 0)}/{workload['spec'].get('replicas', 1)} ready"
        containers = workload["spec"]["template"]["spec"]["containers"]
        images = ", ".join(c["image"] for c in containers)
        lines.append(f"{component.name:<20} {component.resource}: {counts}; image {images}")
        for pod in sorted((p for p in pods if _labels(p).get("app") == component.app), key=_name):
            problem = _pod_problem(pod)
            node = pod.get("spec", {}).get("nodeName") or "<unscheduled>"
            state = "Running, ready" if problem is None else problem
            lines.append(f"    pod {_name(pod)} node={node}: {state}")
    return lines


# -- nodes -----------------------------------------------------------------------------------


def check_nodes(nodes: Iterable[Obj], protocol: Protocol) -> Report:
    """Each enabled node's protocol resource capacity equals its device-count label."""
    report = Report()
    labels = protocol.labels
    res = protocol.resources
    enabled = [n for n in nodes if _labels(n).get(labels.enable) == "true"]
    if not enabled:
        report.problems.append(
            f"no node carries {labels.enable}=true; fix: kubectl label node <gpu-node>"
            f" {labels.enable}=true"
        )
    for node in enabled:
        name = _name(node)
        node_labels = _labels(node)
        capacity = (node.get("status") or {}).get("capacity") or {}
        count = _int(node_labels.get(labels.device_count))
        if count is None:
            report.problems.append(
                f"node {name}: no {labels.device_count} label (the Device Plugin writes it);"
                f" fix: check the device plugin pod on {name}"
                f" (deploy-all.sh status --components=device-plugin)"
            )
            continue
        kind = node_labels.get(labels.device_kind, "gpu").lower()
        mode = node_labels.get(labels.device_mode, "").lower()
        if "mixed" in (kind, mode):
            report.ok.append(f"node {name}: mixed device kinds or modes, capacity not compared")
            continue
        if mode == "mig":
            mig = {k: _int(v) or 0 for k, v in capacity.items() if res.mig_profile(k) is not None}
            if not any(mig.values()):
                report.problems.append(
                    f"node {name}: MIG mode but no {res.mig_prefix}/mig-* capacity;"
                    " fix: check the device plugin pod on the node"
                )
            else:
                total = ", ".join(f"{k}={v}" for k, v in sorted(mig.items()))
                report.ok.append(f"node {name}: MIG capacity {total}")
            continue
        known = devicekind.by_name(kind)
        if known is None:
            report.problems.append(
                f"node {name}: {labels.device_kind}={kind} is not a device kind this Runtime"
                f" Kit offers ({', '.join(devicekind.names())}), so its devices are not"
                " advertised; fix: a Runtime Kit release that knows the kind"
            )
            continue
        expected: dict[str, int] = {known.resource(res): count}
        if known.shareable:
            # TDM: 100 core and memory units per device; exclusive: the resources exist, empty.
            # Without a mode label, either unit present means TDM: a renamed core (or memory)
            # resource is then named as missing, not its partner as unexpected.
            units = (_int(capacity.get(r)) or 0 for r in (res.core, res.memory))
            tdm = mode == "tdm" or (mode == "" and any(u > 0 for u in units))
            expected[res.core] = 100 * count if tdm else 0
            expected[res.memory] = 100 * count if tdm else 0
        wrong = [
            f"{r}={capacity.get(r, '<none>')} (want {want})"
            for r, want in expected.items()
            if (_int(capacity.get(r)) or 0) != want
        ]
        if wrong:
            report.problems.append(
                f"node {name}: {labels.device_count}={count} but capacity {'; '.join(wrong)};"
                f" fix: check the device plugin pod on {name} and the Runtime there"
                " (hack/node-precheck.sh)"
            )
        else:
            report.ok.append(
                f"node {name}: capacity matches {labels.device_count}={count}"
                f" ({', '.join(f'{r}={v}' for r, v in expected.items())})"
            )
    return report


def _domains(protocol: Protocol) -> set[str]:
    res = protocol.resources
    names = devicekind.resource_names(res)
    return {n.rpartition("/")[0] for n in names} | {res.mig_prefix}


def stale_resources(nodes: Iterable[Obj], protocol: Protocol) -> dict[str, list[str]]:
    """node -> extended resources under a protocol domain but not a current protocol name,
    with capacity > 0 and allocatable 0: the residue of a renamed resource."""
    res = protocol.resources
    current = set(devicekind.resource_names(res))
    domains = _domains(protocol)
    stale: dict[str, list[str]] = {}
    for node in nodes:
        status = node.get("status") or {}
        capacity = status.get("capacity") or {}
        allocatable = status.get("allocatable") or {}
        for resource, value in capacity.items():
            domain, slash, _ = resource.rpartition("/")
            if not slash or domain not in domains or resource in current:
                continue
            if res.mig_profile(resource) is not None:
                continue
            if (_int(value) or 0) > 0 and (_int(allocatable.get(resource, "0")) or 0) == 0:
                stale.setdefault(_name(node), []).append(resource)
    return stale


def stale_report(nodes: Iterable[Obj], protocol: Protocol) -> Report:
    report = Report()
    stale = stale_resources(nodes, protocol)
    for node, resources in sorted(stale.items()):
        report.problems.append(
            f"node {node}: stale resource(s) {', '.join(sorted(resources))} (capacity > 0,"
            " allocatable 0: an old protocol name); fix: deploy-all.sh cleanup-stale-resources"
        )
    if not stale:
        report.ok.append("no stale protocol resources on any node")
    return report


def json_pointer(resource: str) -> str:
    return resource.replace("~", "~0").replace("/", "~1")


def cleanup_patches(nodes: Iterable[Obj], protocol: Protocol) -> dict[str, list[dict[str, str]]]:
    """node -> JSON patch of its status removing the stale resources (capacity, allocatable)."""
    nodes = list(nodes)
    stale = stale_resources(nodes, protocol)
    patches: dict[str, list[dict[str, str]]] = {}
    for node in nodes:
        name = _name(node)
        if name not in stale:
            continue
        status = node.get("status") or {}
        ops: list[dict[str, str]] = []
        for resource in sorted(stale[name]):
            for part in ("capacity", "allocatable"):
                if resource in (status.get(part) or {}):
                    ops.append({"op": "remove", "path": f"/status/{part}/{json_pointer(resource)}"})
        patches[name] = ops
    return patches


# -- ConfigMaps and the protocol the pods run ---------------------------------------------------

PROTOCOL_KEY = "protocol.yaml"
KEPT_ANNOTATION = "lj-runtimekit.io/kept-live-config"
"""On a component ConfigMap: `deploy --keep-live-config` kept its live data (an edit made
with kubectl); a later deploy asks again before replacing it."""


def live_protocols(
    configmaps: Iterable[Obj], components: Iterable[Component], namespace: str
) -> tuple[dict[str, Protocol], Report]:
    """Component name -> the protocol in its live ConfigMap; problems for a missing or
    broken one."""
    report = Report()
    by_name = {_name(cm): cm for cm in configmaps}
    protocols: dict[str, Protocol] = {}
    for component in components:
        cm = by_name.get(component.configmap)
        if cm is None:
            report.problems.append(
                f"{component.name}: ConfigMap {namespace}/{component.configmap} not found;"
                f" fix: deploy-all.sh deploy --components={component.name}"
            )
            continue
        text = (cm.get("data") or {}).get(PROTOCOL_KEY)
        where = f"ConfigMap {namespace}/{component.configmap} key {PROTOCOL_KEY}"
        if text is None:
            report.problems.append(f"{component.name}: {where} is missing; fix: redeploy it")
            continue
        try:
            protocols[component.name] = parse_protocol_text(text, where)
        except ProtocolError as exc:
            report.problems.append(f"{component.name}: {exc}; fix: correct it (kubectl edit)")
    return protocols, report


def agreed_protocol(protocols: Mapping[str, Protocol]) -> Protocol | None:
    """The one protocol every ConfigMap holds, or None when they disagree or there is none."""
    hashes = {protocol_sha256(p) for p in protocols.values()}
    return next(iter(protocols.values())) if len(hashes) == 1 else None


def check_configmaps(
    configmaps: Iterable[Obj],
    source: Protocol,
    source_name: str,
    components: Iterable[Component],
    namespace: str,
) -> Report:
    """The live protocol ConfigMaps agree with each other, key by key. A difference from the
    source (`source_name`) is information: the live ConfigMaps are what the operator runs."""
    components = list(components)
    protocols, report = live_protocols(configmaps, components, namespace)
    flats = {name: p.as_flat() for name, p in protocols.items()}
    keys = sorted(source.as_flat())
    disagree = [k for k in keys if len({flat[k] for flat in flats.values()}) > 1]
    for key in disagree:
        each = ", ".join(f"{name}={flat[key]}" for name, flat in flats.items())
        report.problems.append(f"protocol ConfigMaps disagree: {key}: {each}")
    if disagree:
        cms = " ".join(c.configmap for c in components if c.name in flats)
        report.problems.append(
            f"{len(disagree)} protocol key(s) differ between the ConfigMaps; fix: give them the"
            f" same {PROTOCOL_KEY} (kubectl -n {namespace} edit configmap {cms}), then"
            f" kubectl -n {namespace} rollout restart"
            f" {' '.join(c.resource for c in components if c.name in flats)}"
        )
        return report
    live = agreed_protocol(protocols)
    if live is None:
        return report
    report.ok.append(
        f"protocol ConfigMaps agree: {', '.join(flats)} (sha256 {protocol_sha256(live)[:12]})"
    )
    want = source.as_flat()
    have = live.as_flat()
    differ = [f"{k}={have[k]} ({source_name}: {want[k]})" for k in keys if want[k] != have[k]]
    if differ:
        report.info.append(
            f"the live protocol differs from {source_name}: {'; '.join(differ)}"
            " (the ConfigMaps are what runs; deploy asks before replacing them)"
        )
    return report


def _pod_running(pod: Obj) -> bool:
    meta = pod.get("metadata", {})
    return (pod.get("status") or {}).get("phase") == "Running" and not meta.get("deletionTimestamp")


def _template_checksum(workload: Obj | None) -> str | None:
    template = (workload or {}).get("spec", {}).get("template", {}).get("metadata", {})
    checksum: str | None = (template.get("annotations") or {}).get(CHECKSUM_ANNOTATION)
    return checksum


def check_running_protocol(
    components: Iterable[Component],
    workloads: Iterable[Obj],
    configmaps: Iterable[Obj],
    pods: Iterable[Obj],
    nodes: Iterable[Obj],
    metrics: Mapping[str, str],
    namespace: str,
) -> tuple[Report, set[str]]:
    """Each running pod of the protocol components runs its ConfigMap's protocol: the hash
    the pod reports (the Device Plugin on its Node, the others on /metrics: `metrics`, pod
    name -> the answer read) equals the ConfigMap's. A pod that reports none is judged by its
    pod template's config checksum. Returns the report and the pods it named."""
    components = [c for c in components if c.name in PROTOCOL_COMPONENTS]
    protocols, _ = live_protocols(configmaps, components, namespace)
    by_key = {(w.get("kind"), _name(w)): w for w in workloads}
    by_cm = {_name(cm): cm for cm in configmaps}
    on_node = {
        _name(n): (n.get("metadata", {}).get("annotations") or {}).get(NODE_ANNOTATION)
        for n in nodes
    }
    pods = [p for p in pods if _pod_running(p)]
    report = Report()
    named: set[str] = set()
    for component in components:
        if component.name not in protocols:
            continue  # reported by check_configmaps
        want = protocol_sha256(protocols[component.name])
        mine = sorted((p for p in pods if _labels(p).get("app") == component.app), key=_name)
        fix = f"fix: kubectl -n {namespace} rollout restart {component.resource}"
        good, old, silent = [], [], []
        for pod in mine:
            name = _name(pod)
            if component.name == "device-plugin":
                node = pod.get("spec", {}).get("nodeName") or ""
                reported = on_node.get(node)
                why = f"node {node} carries no {NODE_ANNOTATION}"
            else:
                text = metrics.get(name)
                reported = sha256_from_metrics(text) if text is not None else None
                why = "metrics not read" if text is None else f"no {METRIC} in its metrics"
            if reported == want:
                good.append(name)
            elif reported is not None:
                old.append(f"{namespace}/{name} (sha256 {reported[:12]})")
                named.add(name)
            else:
                silent.append((name, why))
        cm = f"ConfigMap {component.configmap} (sha256 {want[:12]})"
        if old:
            report.problems.append(
                f"{component.name}: pod(s) {', '.join(old)} run another protocol than {cm}; {fix}"
            )
        checksum = config_checksum(by_cm[component.configmap].get("data") or {})
        rolled = _template_checksum(by_key.get((component.kind, component.workload))) == checksum
        changed = _data_changed_at(by_cm[component.configmap])
        started = {_name(p): str((p.get("status") or {}).get("startTime", "")) for p in mine}
        for name, why in silent:
            if rolled:
                report.info.append(
                    f"{component.name}: pod {namespace}/{name} reports no protocol ({why});"
                    " its pod template was rendered with the live ConfigMap"
                )
            elif changed is not None and started[name] >= changed:
                report.info.append(
                    f"{component.name}: pod {namespace}/{name} reports no protocol ({why});"
                    f" it started after {component.configmap} last changed ({changed})"
                )
            else:
                named.add(name)
                report.problems.append(
                    f"{component.name}: pod {namespace}/{name} reports no protocol ({why}) and"
                    f" {component.configmap} changed after its pod template was rendered, so"
                    f" what it runs is unknown; {fix}"
                )
        if good:
            report.ok.append(
                f"{component.name}: {len(good)} pod(s) run the protocol of {cm}: {', '.join(good)}"
            )
    return report, named


def _data_changed_at(cm: Obj) -> str | None:
    """When the ConfigMap's data last changed (its managed fields' time; RFC 3339 UTC)."""
    times = [
        str(entry["time"])
        for entry in cm.get("metadata", {}).get("managedFields") or []
        if entry.get("time") and "f:data" in (entry.get("fieldsV1") or {})
    ]
    return max(times) if times else None


def running_edits(
    configmaps: Iterable[Obj], pods: Iterable[Obj], components: Iterable[Component]
) -> set[str]:
    """The ConfigMaps whose data every running pod of their component started after (so the
    pods run it, whatever their pod template's checksum says)."""
    by_cm = {_name(cm): cm for cm in configmaps}
    pods = [p for p in pods if _pod_running(p)]
    out: set[str] = set()
    for component in components:
        cm = by_cm.get(component.configmap)
        changed = _data_changed_at(cm) if cm is not None else None
        starts = [
            str((p.get("status") or {}).get("startTime", ""))
            for p in pods
            if _labels(p).get("app") == component.app
        ]
        if changed is not None and starts and min(starts) >= changed:
            out.add(component.configmap)
    return out


def check_rolled_config(
    components: Iterable[Component],
    workloads: Iterable[Obj],
    configmaps: Iterable[Obj],
    pods: Iterable[Obj],
    namespace: str,
    skip: Iterable[str] = (),
) -> Report:
    """A ConfigMap changed around deploy-all.sh (kubectl edit) has reached the pods: each
    running pod started after its data last changed. Pods in `skip` are named already."""
    report = Report()
    skip = set(skip)
    by_cm = {_name(cm): cm for cm in configmaps}
    by_key = {(w.get("kind"), _name(w)): w for w in workloads}
    pods = [p for p in pods if _pod_running(p)]
    for component in components:
        workload = by_key.get((component.kind, component.workload))
        cm = by_cm.get(component.configmap)
        if workload is None or cm is None:
            continue  # reported by the other checks
        if _template_checksum(workload) == config_checksum(cm.get("data") or {}):
            continue  # the pods were rolled with this data
        changed = _data_changed_at(cm)
        stale = [
            _name(p)
            for p in pods
            if _labels(p).get("app") == component.app
            and _name(p) not in skip
            and (changed is None or str((p.get("status") or {}).get("startTime", "")) < changed)
        ]
        if stale:
            report.problems.append(
                f"{component.name}: ConfigMap {component.configmap} changed"
                f" ({changed or 'time unknown'}) after pod(s) {', '.join(sorted(stale))} started;"
                f" fix: kubectl -n {namespace} rollout restart {component.resource}"
            )
    return report


def check_baked(
    components: Iterable[Component], workloads: Iterable[Obj], protocol: Protocol, namespace: str
) -> Report:
    """The values rendered into the workloads from the protocol (the DaemonSets' nodeSelector
    and tolerations, the Controller's label key) match the live protocol: a ConfigMap edit
    cannot change them, a deploy must."""
    report = Report()
    by_key = {(w.get("kind"), _name(w)): w for w in workloads}
    enable = protocol.labels.enable
    res = protocol.resources
    for component in components:
        workload = by_key.get((component.kind, component.workload))
        if workload is None:
            continue
        spec = workload.get("spec", {}).get("template", {}).get("spec", {})
        wrong: list[str] = []
        if component.kind == "DaemonSet":
            selector = spec.get("nodeSelector") or {}
            if selector.get(enable) != "true":
                shown = ", ".join(f"{k}={v}" for k, v in selector.items()) or "none"
                wrong.append(f"nodeSelector {shown} (labels.enable is {enable})")
            tolerated = {t.get("key") for t in spec.get("tolerations") or []}
            for kind in devicekind.kinds():
                if kind.resource(res) not in tolerated:
                    wrong.append(
                        f"no toleration of {kind.resource(res)} (resources.{kind.resource_key})"
                    )
        if component.name == "controller":
            args = [a for c in spec.get("containers") or [] for a in c.get("args") or []]
            keys = [a.split("=", 1)[1] for a in args if a.startswith("--label-key=")]
            if keys and keys[0] != enable:
                wrong.append(f"--label-key={keys[0]} (labels.enable is {enable})")
        for what in wrong:
            report.problems.append(
                f"{component.name}: {component.kind} {namespace}/{component.workload} {what}:"
                " rendered at deploy time from another protocol, a ConfigMap edit cannot change"
                f" it; fix: deploy-all.sh deploy --keep-live-config --namespace={namespace}"
            )
    return report


def edited_configs(
    live: Iterable[Obj],
    workloads: Iterable[Obj],
    rendered: Iterable[Obj],
    components: Iterable[Component],
) -> dict[str, list[str]]:
    """ConfigMap -> the keys a deploy would replace (with the protocol keys of
    protocol.yaml), for each live ConfigMap edited since the last deploy: its data is not
    what its workload's pod template was rendered with, or it was kept by
    --keep-live-config."""
    running = running_checksums(components, workloads)
    new = {_name(o): dict(o.get("data") or {}) for o in rendered if o.get("kind") == "ConfigMap"}
    edited: dict[str, list[str]] = {}
    for cm in live:
        name = _name(cm)
        data = dict(cm.get("data") or {})
        kept = KEPT_ANNOTATION in (cm.get("metadata", {}).get("annotations") or {})
        if name not in new or data == new[name]:
            continue
        if not kept and running.get(name, config_checksum(data)) == config_checksum(data):
            continue
        keys = []
        for key in sorted(set(data) | set(new[name])):
            if data.get(key) == new[name].get(key):
                continue
            if key == PROTOCOL_KEY:
                key += _protocol_keys(data.get(key), new[name].get(key))
            keys.append(key)
        edited[name] = keys
    return edited


def _protocol_keys(live: str | None, rendered: str | None) -> str:
    """` (key, key)`: the protocol keys whose values differ; empty when unreadable or none."""
    try:
        a = parse_protocol_text(live or "", "live").as_flat()
        b = parse_protocol_text(rendered or "", "rendered").as_flat()
    except ProtocolError:
        return ""
    keys = [k for k in a if a[k] != b[k]]
    return f" ({', '.join(keys)})" if keys else ""


# -- configuration history (rollback) ---------------------------------------------------------

PREVIOUS_DATA_ANNOTATION = "lj-runtimekit.io/previous-data"
"""On a component ConfigMap: its data before the last deploy changed it (JSON), what
`rollback` restores."""


def _json(data: Mapping[str, str]) -> str:
    return json.dumps(dict(data), sort_keys=True, separators=(",", ":"))


def save_previous_config(
    live: Iterable[Obj],
    names: Iterable[str],
    rendered: Iterable[Obj] = (),
    running: Mapping[str, str] | None = None,
    ran: Iterable[str] = (),
) -> dict[str, Obj]:
    """Merge patches recording the live data of the ConfigMaps `names` before a deploy
    (`rendered`: what it applies) or an upgrade (which keeps the data): a ConfigMap the
    change alters records its data when its pods run it (`running`: ConfigMap -> the
    workload's pod template checksum, or `ran`: ConfigMaps whose pods started after their
    last edit; a hand edit that never ran is not recorded); one it keeps but that
    recorded older data records its own (a rollback of an image-only change keeps the
    configuration)."""
    by_name = {_name(cm): cm for cm in live}
    new = {_name(o): dict(o.get("data") or {}) for o in rendered if o.get("kind") == "ConfigMap"}
    patches: dict[str, Obj] = {}
    for name in names:
        cm = by_name.get(name)
        if cm is None:
            continue
        data = dict(cm.get("data") or {})
        recorded = (cm.get("metadata", {}).get("annotations") or {}).get(PREVIOUS_DATA_ANNOTATION)
        runs = (running or {}).get(name, config_checksum(data)) == config_checksum(data)
        changes = name in new and new[name] != data and (runs or name in set(ran))
        if changes or (recorded is not None and recorded != _json(data)):
            annotations = {PREVIOUS_DATA_ANNOTATION: _json(data)}
            patches[name] = {"metadata": {"annotations": annotations}}
    return patches


def running_checksums(components: Iterable[Component], workloads: Iterable[Obj]) -> dict[str, str]:
    """ConfigMap -> the config checksum in its workload's pod template."""
    by_key = {(w.get("kind"), _name(w)): w for w in workloads}
    out: dict[str, str] = {}
    for component in components:
        checksum = _template_checksum(by_key.get((component.kind, component.workload)))
        if checksum is not None:
            out[component.configmap] = checksum
    return out


def keep_live_config(
    rendered: Iterable[Obj], live: Iterable[Obj], names: Iterable[str]
) -> list[dict[str, Any]]:
    """`rendered` with the live data of the ConfigMaps `names`, marked kept
    (KEPT_ANNOTATION), and its checksum on their workloads' pod templates."""
    by_name = {_name(cm): dict(cm.get("data") or {}) for cm in live}
    keep = {n: by_name[n] for n in names if n in by_name}
    objs = json.loads(json.dumps(list(rendered)))  # a deep copy
    checksums: dict[str, str] = {}
    for obj in objs:
        name = _name(obj)
        if obj.get("kind") == "ConfigMap" and name in keep:
            obj["data"] = keep[name]
            obj["metadata"].setdefault("annotations", {})[KEPT_ANNOTATION] = "true"
            checksums[obj["metadata"].get("labels", {}).get("app", "")] = config_checksum(
                keep[name]
            )
    for obj in objs:
        template = obj.get("spec", {}).get("template", {}).get("metadata", {})
        app = template.get("labels", {}).get("app")
        if obj.get("kind") in ("DaemonSet", "Deployment") and app in checksums:
            template["annotations"][CHECKSUM_ANNOTATION] = checksums[app]
    out: list[dict[str, Any]] = objs
    return out


def restore_previous_config(
    live: Iterable[Obj], names: Iterable[str]
) -> dict[str, tuple[Obj, str, str]]:
    """Per ConfigMap of `names` whose recorded previous data differs: the merge patch that puts
    it back (and records the current data in its place, so a second rollback undoes the
    first), the current and the restored data's checksums."""
    by_name = {_name(cm): cm for cm in live}
    out: dict[str, tuple[Obj, str, str]] = {}
    for name in names:
        cm = by_name.get(name)
        recorded = ((cm or {}).get("metadata", {}).get("annotations") or {}).get(
            PREVIOUS_DATA_ANNOTATION
        )
        if cm is None or recorded is None:
            continue
        try:
            previous = json.loads(recorded)
        except ValueError as exc:
            raise DeployError(
                f"ConfigMap {name} annotation {PREVIOUS_DATA_ANNOTATION}: not JSON ({exc});"
                " fix: remove the annotation (kubectl annotate configmap ... key-)"
            ) from exc
        current = dict(cm.get("data") or {})
        if previous == current:
            continue
        data: dict[str, str | None] = {k: None for k in current if k not in previous}
        data.update(previous)
        patch = {
            "metadata": {"annotations": {PREVIOUS_DATA_ANNOTATION: _json(current)}},
            "data": data,
        }
        out[name] = (patch, config_checksum(current), config_checksum(previous))
    return out


# -- uninstall -------------------------------------------------------------------------------

STATE_PREFIX = "lj-runtimekit.io/"
"""The Controller's node state keys (labels and annotations) start with it."""


def node_key_patches(nodes: Iterable[Obj], protocol: Protocol) -> dict[str, Obj]:
    """Per node carrying any: the merge patch removing the Runtime Kit's labels and
    annotations (the protocol's keys and the Controller's lj-runtimekit.io/ state)."""
    flat = protocol.as_flat()
    keys = {v for k, v in flat.items() if k.startswith(("labels.", "annotations."))}
    patches: dict[str, Obj] = {}
    for node in nodes:
        meta = node.get("metadata", {})
        remove: dict[str, dict[str, None]] = {}
        for field_name in ("labels", "annotations"):
            found = [
                k for k in meta.get(field_name) or {} if k in keys or k.startswith(STATE_PREFIX)
            ]
            if found:
                remove[field_name] = dict.fromkeys(sorted(found))
        if remove:
            patches[_name(node)] = {"metadata": remove}
    return patches


# -- metrics ---------------------------------------------------------------------------------


def check_metrics(text: str, where: str) -> Report:
    report = Report()
    helps = sum(1 for line in text.splitlines() if line.startswith("# HELP "))
    types = sum(1 for line in text.splitlines() if line.startswith("# TYPE "))
    if helps and types:
        report.ok.append(f"exporter {where}: {helps} metric families (# HELP/# TYPE)")
    else:
        report.problems.append(
            f"exporter {where}: no # HELP/# TYPE lines in the answer; fix: kubectl logs the"
            " exporter pod"
        )
    return report


# -- DRA mode ------------------------------------------------------------------------------------

PUBLISH_WINDOW_S = 60
"""How long a pool's slices may disagree (generations, slice count) while the DRA plugin
publishes: it writes them one after another, each write retried for up to 30 s."""
_MODES = ("exclusive", "tdm", "mig")
_TDM_MEMORY_SLACK = 100
"""A TDM device's `memory` capacity is 100 steps of 1 % of its memory, rounded up: less than
100 bytes above what the Runtime reports."""
_SERIES_RE = re.compile(r"^(lj_runtimekit_\w+?)(?:\{(.*)\})?\s+(\S+)")
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"n": "\n", '"': '"', "\\": "\\"}
_LABEL_NAMES = {
    "uuid": "UUID",
    "device": "gpu",
    "mig_profile": "GPU_I_PROFILE",
    "mig_instance_id": "GPU_I_ID",
}
"""The Exporter's labels read here -> their name under --dcgm-label-names."""
_SI = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_BYTES_RE = re.compile(r"^(\d+)([KMGTPE]i|[kMGTPE])?$")


@dataclass(frozen=True)
class RuntimeDevice:
    """A device or MIG instance the Runtime reports, as the DRA plugin publishes it."""

    uuid: str
    what: str
    """How the operator knows it: `gpu 3`, `gpu 6 MIG 1g.10gb instance 9`."""
    mode: str
    """`exclusive`, `tdm` or `mig` (a MIG instance)."""
    healthy: bool
    memory: int


def _series(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    for line in text.splitlines():
        match = _SERIES_RE.match(line)
        if match is None:
            continue
        labels = {
            k: re.sub(r"\\(.)", lambda m: _UNESCAPE.get(m.group(1), m.group(0)), v)
            for k, v in _LABEL_RE.findall(match.group(2) or "")
        }
        try:
            yield match.group(1), labels, float(match.group(3))
        except ValueError:
            continue


def _label(labels: Mapping[str, str], name: str) -> str:
    return labels.get(name, labels.get(_LABEL_NAMES.get(name, name), ""))


def exporter_inventory(text: str) -> list[RuntimeDevice] | None:
    """What a node's Exporter read from its Runtime (its /metrics answer), as the DRA plugin
    publishes it: exclusive and TDM devices, the instances of a MIG-mode GPU (not the GPU),
    nothing of an unknown kind or mode. None when the answer holds no inventory (the Exporter
    cannot read the Runtime: `lj_runtimekit_runtime_up` 0, or no device series)."""
    info: dict[str, tuple[str, str]] = {}
    modes: dict[str, str] = {}
    healthy: dict[str, bool] = {}
    memory: dict[str, int] = {}
    migs: dict[tuple[str, str], tuple[str, str]] = {}
    mig_memory: dict[tuple[str, str], int] = {}
    mig_healthy: dict[tuple[str, str], bool] = {}
    up: float | None = None
    for name, labels, value in _series(text):
        uuid = _label(labels, "uuid")
        instance = (uuid, _label(labels, "mig_instance_id"))
        family = name.removeprefix("lj_runtimekit_")
        if family == "runtime_up":
            up = value
        elif family == "device_info":
            info[uuid] = (labels.get("kind", ""), _label(labels, "device"))
        elif family == "device_mode" and value == 1:
            modes[uuid] = labels.get("mode", "")
        elif family == "device_healthy":
            healthy[uuid] = value == 1
        elif family == "device_memory_total_bytes":
            memory[uuid] = int(value)
        elif family == "mig_info":
            migs[instance] = (labels.get("mig_uuid", ""), _label(labels, "mig_profile"))
        elif family == "mig_memory_total_bytes":
            mig_memory[instance] = int(value)
        elif family == "mig_healthy":
            mig_healthy[instance] = value == 1
    if up == 0 or (up is None and not info):
        return None
    out: list[RuntimeDevice] = []
    for uuid, (kind_name, index) in info.items():
        kind = devicekind.by_name(kind_name)
        mode = modes.get(uuid, "")
        if kind is None or mode not in _MODES:
            continue
        what = f"{kind_name} {index}"
        if mode != "mig":
            out.append(
                RuntimeDevice(uuid, what, mode, healthy.get(uuid, False), memory.get(uuid, 0))
            )
            continue
        if not kind.shareable:
            continue
        for (parent, number), (mig_uuid, profile) in migs.items():
            if parent != uuid:
                continue
            key = (parent, number)
            out.append(
                RuntimeDevice(
                    mig_uuid,
                    f"{what} MIG {profile} instance {number}",
                    "mig",
                    healthy.get(uuid, False) and mig_healthy.get(key, False),
                    mig_memory.get(key, 0),
                )
            )
    return out


def _bytes(value: object) -> int | None:
    """A whole-byte quantity as the API server writes it (`85899346k`, `10Gi`)."""
    match = _BYTES_RE.match(str(value))
    if match is None:
        return None
    suffix = match.group(2) or ""
    return int(match.group(1)) * (_BINARY.get(suffix) or _SI.get(suffix, 0))


def _attribute(device: Obj, name: str, driver: str) -> object:
    """A device attribute's value (bare, or qualified by the driver's domain)."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name, attributes.get(f"{driver}/{name}")) or {}
    return next(iter(value.values()), None) if isinstance(value, Mapping) else None


def _differences(
    devices: Iterable[Obj], runtime: Iterable[RuntimeDevice], driver: str
) -> list[str]:
    """What the published devices get wrong, matched by `uuid`: a device the Runtime has (and
    reports healthy: an unhealthy one may be left out) but the pool lacks, a device the
    Runtime lacks, and mode, health (a taint) or memory capacity not the Runtime's."""
    published = {str(_attribute(d, "uuid", driver)): d for d in devices}
    wanted = {d.uuid: d for d in runtime}
    out: list[str] = []
    for uuid, want in wanted.items():
        if uuid not in published and want.healthy:
            out.append(f"missing {want.what} ({uuid})")
    for uuid, device in published.items():
        name = str(device.get("name", "?"))
        want_or_none = wanted.get(uuid)
        if want_or_none is None:
            out.append(f"extra {name} ({uuid})")
            continue
        want = want_or_none
        mode = _attribute(device, "mode", driver)
        if mode != want.mode:
            out.append(f"{name} mode {mode} (Runtime: {want.mode})")
        tainted = bool(device.get("taints"))
        if tainted == want.healthy:
            health = "healthy" if want.healthy else "unhealthy"
            out.append(f"{name} {'tainted' if tainted else 'untainted'} (Runtime: {health})")
        raw = ((device.get("capacity") or {}).get("memory") or {}).get("value")
        memory = _bytes(raw)
        above = (memory if memory is not None else -1) - want.memory
        if not (0 <= above < _TDM_MEMORY_SLACK if want.mode == "tdm" else above == 0):
            out.append(f"{name} memory {raw} (Runtime: {want.memory})")
    return out


def _written_at(slices: Iterable[Obj]) -> datetime | None:
    """The last write of any of `slices` (their managed fields' times), None when unknown."""
    times = [
        datetime.fromisoformat(str(entry["time"]))
        for s in slices
        for entry in s.get("metadata", {}).get("managedFields") or []
        if entry.get("time")
    ]
    return max(times) if times else None


def _age(slices: Iterable[Obj], now: datetime | None) -> int | None:
    written = _written_at(slices)
    if now is None or written is None:
        return None
    return int((now - written).total_seconds())


def _exporter_metrics(
    node: str, pods: Iterable[Obj], metrics: Mapping[str, str]
) -> tuple[str, str] | None:
    """(pod, /metrics answer) of an Exporter pod on `node` whose answer was read."""
    for pod in sorted(pods, key=_name):
        if (
            _labels(pod).get("app") == BY_NAME["exporter"].app
            and pod.get("spec", {}).get("nodeName") == node
            and _name(pod) in metrics
        ):
            return _name(pod), metrics[_name(pod)]
    return None


def check_dra(
    workloads: Iterable[Obj],
    pods: Iterable[Obj],
    nodes: Iterable[Obj],
    device_classes: Iterable[Obj],
    resource_slices: Iterable[Obj],
    want_classes: Iterable[str],
    protocol: Protocol,
    namespace: str,
    *,
    metrics: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> Report:
    """DRA mode: the driver's DeviceClasses exist; on each enabled node labelled
    `labels.device_api` = dra the DRA plugin runs (ready) and publishes one pool of
    ResourceSlices of the driver, its slices at one generation (beyond PUBLISH_WINDOW_S
    before `now`), holding the devices its Runtime reports with their mode, health and
    memory (the Runtime as the node's Exporter read it: `metrics`, pod name -> its /metrics
    answer); the DRA plugin's DaemonSet runs nowhere else and no other node has slices of
    the driver."""
    report = Report()
    driver = protocol.dra.driver
    live = {_name(c) for c in device_classes}
    missing = [name for name in want_classes if name not in live]
    if missing:
        report.problems.append(
            f"{DRA_PLUGIN.name}: DeviceClass(es) {', '.join(missing)} missing; fix: deploy-all.sh"
            " deploy --dra"
        )
    else:
        report.ok.append(f"{DRA_PLUGIN.name}: {len(live)} DeviceClass(es) of driver {driver}")
    api = protocol.labels.device_api
    dra_nodes = sorted(
        _name(n)
        for n in nodes
        if _labels(n).get(protocol.labels.enable) == "true" and _labels(n).get(api) == DRA_MODE
    )
    pods = list(pods)
    by_node: dict[str, list[Obj]] = {}
    for item in resource_slices:
        spec = item.get("spec") or {}
        if spec.get("driver") == driver and spec.get("nodeName"):
            by_node.setdefault(str(spec["nodeName"]), []).append(item)
    if not dra_nodes:
        report.info.append(
            f"{DRA_PLUGIN.name}: no enabled node is labelled {api}={DRA_MODE}: the DRA plugin"
            f" runs nowhere (kubectl label node <gpu-node> {api}={DRA_MODE})"
        )
    else:
        report.extend(
            check_workloads([DRA_PLUGIN], workloads, pods, namespace, protocol.labels.enable)
        )
    for node in dra_nodes:
        report.extend(
            _check_pool(node, by_node.get(node, []), pods, metrics or {}, protocol, namespace, now)
        )
    for node in sorted(set(by_node) - set(dra_nodes)):
        report.extend(_check_stray(node, by_node[node], pods, protocol, now))
    return report


def _check_pool(
    node: str,
    slices: list[Obj],
    pods: list[Obj],
    metrics: Mapping[str, str],
    protocol: Protocol,
    namespace: str,
    now: datetime | None,
) -> Report:
    """One DRA node: its pool is there, whole, at one generation, and what its Runtime has."""
    report = Report()
    driver = protocol.dra.driver
    plugin = f"{DRA_PLUGIN.name}: node {node}"
    pods_of = (
        f"kubectl -n {namespace} get pods -l app={DRA_PLUGIN.app}"
        f" --field-selector spec.nodeName={node}"
    )
    restart = (
        f"fix: read its DRA plugin's log ({pods_of}, then kubectl logs), then restart it"
        f" (kubectl -n {namespace} delete pods -l app={DRA_PLUGIN.app}"
        f" --field-selector spec.nodeName={node})"
    )
    if not slices:
        report.problems.append(
            f"{plugin} ({protocol.labels.device_api}={DRA_MODE}) publishes no ResourceSlice of"
            f" driver {driver}; fix: read its DRA plugin's log ({pods_of}, then kubectl logs)"
        )
        return report
    others = sorted({str(s["spec"].get("pool", {}).get("name")) for s in slices} - {node})
    if others:
        report.problems.append(
            f"{plugin}: ResourceSlices of driver {driver} in pool(s) {', '.join(others)} (the DRA"
            f" plugin publishes one pool, named after the node); fix: kubectl delete"
            f" resourceslices --field-selector spec.driver={driver},spec.nodeName={node}, then"
            f" restart its DRA plugin (kubectl -n {namespace} delete pods -l app={DRA_PLUGIN.app}"
            f" --field-selector spec.nodeName={node})"
        )
        return report
    pools = [s["spec"].get("pool") or {} for s in slices]
    at = [int(p.get("generation") or 0) for p in pools]
    generations = sorted(set(at))
    top = generations[-1]
    current = [s for s, g in zip(slices, at, strict=True) if g == top]
    count = max(
        int(p.get("resourceSliceCount") or 0) for p, g in zip(pools, at, strict=True) if g == top
    )
    if len(generations) > 1 or len(current) != count:
        shown = (
            f"slices at generations {', '.join(map(str, generations))}"
            if len(generations) > 1
            else f"{len(current)} slice(s) at generation {top} of {count}"
        )
        age = _age(slices, now)
        if age is not None and age > PUBLISH_WINDOW_S:
            report.problems.append(
                f"{plugin}: pool {node} has {shown}, last written {age} s ago (a publish takes"
                f" under {PUBLISH_WINDOW_S} s): the scheduler sees {len(current)} of {count}"
                f" slice(s) of generation {top}; {restart}"
            )
        else:
            when = "at an unknown time" if age is None else f"{age} s ago"
            report.info.append(
                f"{plugin}: pool {node} has {shown}, last written {when}: a publish may be under"
                " way, its devices are not compared with the Runtime; run verify again"
            )
        return report
    devices = [d for s in current for d in s["spec"].get("devices") or []]
    read = _exporter_metrics(node, pods, metrics)
    if read is None:
        report.info.append(
            f"{plugin}: its slices are not compared with the Runtime: no Exporter /metrics read"
            " from the node (verify reads them with the exporter among --components, through"
            " the API server proxy or --metrics-url=POD=URL)"
        )
        report.ok.append(f"{plugin} publishes {len(devices)} device(s) of {driver}")
        return report
    pod, text = read
    runtime = exporter_inventory(text)
    if runtime is None:
        report.problems.append(
            f"{plugin}: the Exporter pod {namespace}/{pod} reports no device inventory"
            " (lj_runtimekit_runtime_up 0: it cannot read the Runtime), so the slices are not"
            f" compared; fix: check the Runtime on {node} (hack/node-precheck.sh) and"
            f" kubectl -n {namespace} logs {pod}"
        )
        return report
    wrong = _differences(devices, runtime, driver)
    if wrong:
        report.problems.append(
            f"{plugin}: pool {node} (generation {top}) disagrees with the Runtime (as the"
            f" Exporter pod {namespace}/{pod} reads it): {'; '.join(wrong)}; {restart}"
        )
    else:
        report.ok.append(
            f"{plugin} publishes {len(devices)} device(s) of {driver}, as its Runtime reports"
            f" them (Exporter pod {namespace}/{pod})"
        )
    return report


def _check_stray(
    node: str, slices: list[Obj], pods: list[Obj], protocol: Protocol, now: datetime | None
) -> Report:
    """Slices of the driver on a node not in DRA mode: a problem once nothing has written them
    for PUBLISH_WINDOW_S and no DRA plugin pod is left there (the kubelet deletes a gone
    driver's slices 30 s after it unregisters)."""
    report = Report()
    driver = protocol.dra.driver
    age = _age(slices, now)
    plugin_there = any(
        _labels(p).get("app") == DRA_PLUGIN.app and p.get("spec", {}).get("nodeName") == node
        for p in pods
    )
    where = f"{DRA_PLUGIN.name}: ResourceSlices of {driver} for nodes not in DRA mode: {node}"
    if age is not None and age > PUBLISH_WINDOW_S and not plugin_there:
        report.problems.append(
            f"{where} ({len(slices)} slice(s), last written {age} s ago, no DRA plugin there: the"
            " scheduler can allocate their devices to claims the node cannot prepare); fix:"
            f" kubectl delete resourceslices --field-selector spec.driver={driver},"
            f"spec.nodeName={node}"
        )
    else:
        report.info.append(
            f"{where} (left by a node moved back to the Device Plugin: the kubelet deletes them"
            " 30 s after the DRA plugin leaves; deploy-all.sh delete --dra removes them all)"
        )
    return report
