"""What runs on the bed: enabling nodes by label, workload pods, and reading back where
everything landed (scheduler annotations, Device Plugin records, kubelet device IDs,
Runtime allocations, exporter metrics). Shared by the demo, the e2e tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from lj_runtimekit.controller.pkg.featureclient import feature_state
from lj_runtimekit.proto.k8s.podresources.v1 import podresources_pb2, podresources_pb2_grpc
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import (
    AssignmentError,
    DeviceShare,
    Protocol,
    decode_assignment,
    pod_shares,
)
from lj_runtimekit.proto.pkg.protocol.inventory import InventoryError, decode_inventory
from lj_runtimekit.proto.pkg.runtimeclient import RetryPolicy, RuntimeClient, from_request
from lj_runtimekit.sandbox.bed import SYSTEM_NAMESPACE, NodeHandle, Sandbox
from lj_runtimekit.testkit.invariant import Holding, init_containers, sharing_violations
from lj_runtimekit.testkit.waits import NotYet, wait_for

SCHEDULER_NAME = "lj-scheduler"
STATE_ANNOTATION = "lj-runtimekit.io/feature-state"
JOB_SELECTOR = "app.kubernetes.io/managed-by=lj-runtimekit-controller"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"


def label_nodes(
    api: k8s_client.ApiClient, names: Iterable[str], key: str, value: str | None
) -> None:
    """Set (or with None remove) the enable label on nodes."""
    core = k8s_client.CoreV1Api(api)
    for name in names:
        core.patch_node(name, {"metadata": {"labels": {key: value}}})


def wait_feature_state(
    api: k8s_client.ApiClient, names: Sequence[str], state: str, timeout_s: float = 90
) -> None:
    """Until every node's Controller state annotation is `state` and no Job remains."""
    core = k8s_client.CoreV1Api(api)
    batch = k8s_client.BatchV1Api(api)

    def check() -> bool | NotYet:
        states = {
            n: (core.read_node(n).metadata.annotations or {}).get(STATE_ANNOTATION) for n in names
        }
        jobs = batch.list_namespaced_job(SYSTEM_NAMESPACE, label_selector=JOB_SELECTOR).items
        done = all(s == state for s in states.values()) and not jobs
        return done or NotYet(f"states {states}, jobs left {[j.metadata.name for j in jobs]}")

    wait_for(
        check, timeout_s, f"feature state {state} on {len(names)} nodes with their Jobs cleaned"
    )


async def _feature_state(node: NodeHandle) -> tuple[bool, str]:
    async with RuntimeClient(node.sim_dir, retry=RetryPolicy(attempts=3)) as client:
        state = await feature_state(client)
    return state.enabled, state.changed_by


def runtime_feature_states(nodes: Sequence[NodeHandle]) -> dict[str, tuple[bool, str]]:
    """What each node's Runtime (simulator) says of its features: (enabled, changed_by)."""

    async def all_states() -> list[tuple[bool, str]]:
        return list(await asyncio.gather(*(_feature_state(n) for n in nodes)))

    return dict(zip((n.name for n in nodes), asyncio.run(all_states()), strict=True))


# -- pods -------------------------------------------------------------------------------------


def pod_manifest(
    name: str,
    containers: Mapping[str, Mapping[str, int]],
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    init_containers: Mapping[str, Mapping[str, int]] | None = None,
    requests: Mapping[str, str] | None = None,
    sidecars: Collection[str] = (),
) -> dict[str, Any]:
    """A workload pod for the Runtime Kit scheduler: container -> extended resource limits.
    Init containers run `lj-job-agent --version`, which the bed's kubelets really run (so
    they finish and the app containers start); those named in `sidecars` are restartable
    (`restartPolicy: Always`) and run until the pod is deleted. `requests`: each app
    container's cpu and memory requests (default 100m and 128Mi; a hollow node has one
    cpu)."""
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "runtimeClassName": "lj-runtime",
        "containers": [
            {
                "name": cname,
                "image": "registry.example/cuda-sample:12",
                "resources": {
                    "limits": {k: str(v) for k, v in limits.items()},
                    "requests": dict(requests or {"cpu": "100m", "memory": "128Mi"}),
                },
            }
            for cname, limits in containers.items()
        ],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if init_containers:
        spec["initContainers"] = [
            {
                "name": cname,
                "image": "registry.example/cuda-sample:12",
                "resources": {"limits": {k: str(v) for k, v in limits.items()}},
                **(
                    {"restartPolicy": "Always"}
                    if cname in sidecars
                    else {"command": ["lj-job-agent", "--version"]}
                ),
            }
            for cname, limits in init_containers.items()
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


def demo_pods(protocol: Protocol) -> list[dict[str, Any]]:
    """The demo's workload: slices, whole devices, MIG, PPU and a JobSet-style gang."""
    res, ann = protocol.resources, protocol.annotations
    pods = [
        pod_manifest("slice-a", {"main": {res.core: 30, res.memory: 25}}),
        pod_manifest("slice-b", {"main": {res.core: 50, res.memory: 50}}),
        pod_manifest("slice-c", {"main": {res.core: 20, res.memory: 40}}),
        pod_manifest("whole-1", {"main": {res.gpu: 1}}),
        pod_manifest("whole-2", {"main": {res.gpu: 2}}),
        pod_manifest("mig-1g", {"main": {res.mig("1g.10gb"): 1}}),
        pod_manifest("ppu-2", {"main": {res.ppu: 2}}),
    ]
    for i in range(4):
        pods.append(
            pod_manifest(
                f"train-worker-0-{i}",
                {"trainer": {res.gpu: 2}},
                labels={
                    JOBSET_NAME_LABEL: "train",
                    JOBSET_JOB_LABEL: "worker",
                    JOBSET_INDEX_LABEL: "0",
                },
                annotations={ann.gang_group: "train", ann.gang_min_members: "4"},
            )
        )
    return pods


def ensure_namespace(api: k8s_client.ApiClient, namespace: str, timeout_s: float = 30) -> None:
    """Create `namespace` (if absent) and wait for its default ServiceAccount."""
    core = k8s_client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as exc:
        if exc.status != 409:
            raise

    def has_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", namespace)
        except ApiException:
            return False
        return True

    wait_for(has_sa, timeout_s, f"ServiceAccount default in {namespace}")


def create_pods(
    api: k8s_client.ApiClient, namespace: str, pods: Iterable[Mapping[str, Any]]
) -> None:
    core = k8s_client.CoreV1Api(api)
    for pod in pods:
        core.create_namespaced_pod(namespace, dict(pod))


def list_pods(api: k8s_client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """The namespace's pods as JSON dicts."""
    core = k8s_client.CoreV1Api(api)
    response = core.list_namespaced_pod(namespace, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items


def settled(pod: Mapping[str, Any]) -> bool:
    """Running, finished, or Pending with a scheduler verdict (not just not-yet-seen)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in status.get("conditions") or ()
    )


def wait_pods(
    api: k8s_client.ApiClient,
    namespace: str,
    names: Sequence[str],
    *,
    timeout_s: float = 90,
    running: bool = False,
) -> list[dict[str, Any]]:
    """Until every named pod settled (or, with `running`, is Running); returns them."""
    wanted = set(names)

    def check() -> list[dict[str, Any]] | NotYet:
        pods = [p for p in list_pods(api, namespace) if p["metadata"]["name"] in wanted]
        phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in pods}
        ok = (lambda p: phases[p["metadata"]["name"]] == "Running") if running else settled
        done = len(pods) == len(wanted) and all(ok(p) for p in pods)
        return pods if done else NotYet(f"phases {phases}")

    result: list[dict[str, Any]] = wait_for(check, timeout_s, f"{len(wanted)} pods in {namespace}")
    return result


# -- where things landed ----------------------------------------------------------------------


@dataclass
class Placement:
    """One pod and what each layer says it holds."""

    namespace: str
    name: str
    node: str
    phase: str
    reason: str
    requests: dict[str, dict[str, int]]
    assigned: dict[str, tuple[DeviceShare, ...]] | None
    """Scheduler: annotations.assigned_devices (None when absent)."""
    allocated: dict[str, tuple[DeviceShare, ...]] | None
    """Device Plugin: annotations.allocated_devices."""
    kubelet_ids: dict[str, dict[str, list[str]]] | None
    """The kubelet's device manager (PodResources List): device IDs per container and
    resource; None when the kubelet does not list the pod."""
    runtime: dict[str, tuple[DeviceShare, ...]] = field(default_factory=dict)
    """Runtime simulator: ListAllocations of the node, per container."""
    uid: str = ""
    init_containers: tuple[tuple[str, bool], ...] = ()
    """The init containers as declared, (name, restartable): `pod_shares` counts by them."""

    @property
    def run_to_completion(self) -> frozenset[str]:
        """Init containers that end before the app containers (not sidecars)."""
        return frozenset(name for name, restartable in self.init_containers if not restartable)


def _decode(text: str | None) -> dict[str, tuple[DeviceShare, ...]] | None:
    if text is None:
        return None
    try:
        return {c: tuple(s) for c, s in decode_assignment(text).items()}
    except AssignmentError:
        return None


KubeletRecords = dict[tuple[str, str], dict[str, dict[str, list[str]]]]
"""(namespace, pod name) -> container -> resource -> device IDs, as the kubelet records."""


def placements(
    pods: Iterable[Mapping[str, Any]],
    protocol: Protocol,
    runtime: Mapping[str, Any] | None = None,
    kubelet: KubeletRecords | None = None,
) -> list[Placement]:
    """Placement rows for pods; `runtime` maps pod uid -> container -> shares, `kubelet` is
    the nodes' PodResources records."""
    ann = protocol.annotations
    out = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        annotations = meta.get("annotations") or {}
        reason = status.get("reason") or ""
        for cond in status.get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                reason = cond.get("message") or cond.get("reason") or ""
        if status.get("message") and status.get("phase") == "Failed":
            reason = f"{reason}: {status['message']}"
        out.append(
            Placement(
                namespace=meta["namespace"],
                name=meta["name"],
                node=spec.get("nodeName") or "",
                phase=status.get("phase") or "",
                reason=reason,
                requests={
                    c["name"]: {
                        k: int(v)
                        for k, v in ((c.get("resources") or {}).get("limits") or {}).items()
                        if "/" in k
                    }
                    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
                },
                assigned=_decode(annotations.get(ann.assigned_devices)),
                allocated=_decode(annotations.get(ann.allocated_devices)),
                kubelet_ids=(kubelet or {}).get((meta["namespace"], meta["name"])),
                runtime=dict((runtime or {}).get(meta.get("uid", ""), {})),
                uid=str(meta.get("uid", "")),
                init_containers=init_containers(pod),
            )
        )
    return out


async def _allocations(node: NodeHandle) -> list[Any]:
    async with RuntimeClient(node.sim_dir, retry=RetryPolicy(attempts=3)) as client:
        return list(await client.list_allocations())


def runtime_allocations(
    nodes: Sequence[NodeHandle],
) -> dict[str, dict[str, dict[str, tuple[DeviceShare, ...]]]]:
    """node -> pod uid -> container -> shares, from every node's Runtime simulator."""

    async def gather() -> list[list[Any]]:
        return list(await asyncio.gather(*(_allocations(n) for n in nodes)))

    out: dict[str, dict[str, dict[str, tuple[DeviceShare, ...]]]] = {}
    for node, allocations in zip(nodes, asyncio.run(gather()), strict=True):
        per_pod: dict[str, dict[str, tuple[DeviceShare, ...]]] = {}
        for a in allocations:
            per_pod.setdefault(a.pod_uid, {})[a.container_name] = tuple(
                from_request(d) for d in a.devices
            )
        out[node.name] = per_pod
    return out


@dataclass
class RuntimePod:
    """One pod's allocations as a node's Runtime lists them."""

    namespace: str
    name: str
    containers: dict[str, tuple[DeviceShare, ...]] = field(default_factory=dict)
    init_containers: frozenset[str] = frozenset()
    """Containers allocated as init containers (`Allocation.init_container`)."""


def runtime_records(nodes: Sequence[NodeHandle]) -> dict[str, dict[str, RuntimePod]]:
    """node -> pod uid -> the pod's allocations, with its name and init containers, from one
    ListAllocations per node (so a pod already deleted is still described)."""

    async def gather() -> list[list[Any]]:
        return list(await asyncio.gather(*(_allocations(n) for n in nodes)))

    out: dict[str, dict[str, RuntimePod]] = {}
    for node, allocations in zip(nodes, asyncio.run(gather()), strict=True):
        per_pod: dict[str, RuntimePod] = {}
        for a in allocations:
            pod = per_pod.setdefault(a.pod_uid, RuntimePod(a.pod_namespace, a.pod_name))
            pod.containers[a.container_name] = tuple(from_request(d) for d in a.devices)
            if a.init_container:
                pod.init_containers |= {a.container_name}
        out[node.name] = per_pod
    return out


def _pod_resources(node: NodeHandle) -> list[podresources_pb2.PodResources]:
    """The node's kubelet PodResources List."""
    with grpc.insecure_channel(f"unix:{node.pod_resources_socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        listed = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=10)
    return list(listed.pod_resources)


def kubelet_records(nodes: Sequence[NodeHandle], protocol: Protocol) -> KubeletRecords:
    """Every node's kubelet record of the device IDs each container got (PodResources List),
    for the Runtime Kit's resources."""
    res = protocol.resources
    ours = (*devicekind.resource_names(res), res.mig(""))
    out: KubeletRecords = {}
    for node in nodes:
        for pod in _pod_resources(node):
            containers = out.setdefault((pod.namespace, pod.name), {})
            for c in pod.containers:
                ids: dict[str, list[str]] = {}
                # One entry per device (each with its topology), or several per entry.
                for d in c.devices:
                    if d.resource_name.startswith(ours):
                        ids.setdefault(d.resource_name, []).extend(d.device_ids)
                if ids:
                    containers[c.name] = ids
    return out


ClaimDevice = tuple[str, str, str]
"""(driver, pool, device) of one device of a ResourceClaim."""
KubeletClaims = dict[tuple[str, str], dict[str, dict[str, list[ClaimDevice]]]]
"""(namespace, pod name) -> container -> claim name -> its devices, as the kubelet records."""


def kubelet_claim_records(nodes: Sequence[NodeHandle]) -> KubeletClaims:
    """Every node's kubelet record of the ResourceClaims each container uses and their
    devices (PodResources List, `dynamic_resources`)."""
    out: KubeletClaims = {}
    for node in nodes:
        for pod in _pod_resources(node):
            containers = out.setdefault((pod.namespace, pod.name), {})
            for c in pod.containers:
                claims = {
                    d.claim_name: [
                        (r.driver_name, r.pool_name, r.device_name) for r in d.claim_resources
                    ]
                    for d in c.dynamic_resources
                }
                if claims:
                    containers[c.name] = claims
    return out


async def _devices(node: NodeHandle) -> list[pb.Device]:
    async with RuntimeClient(node.sim_dir, retry=RetryPolicy(attempts=3)) as client:
        return list(await client.list_devices())


def runtime_inventories(nodes: Sequence[NodeHandle]) -> dict[str, list[pb.Device]]:
    """node -> the devices its Runtime simulator lists."""

    async def gather() -> list[list[pb.Device]]:
        return list(await asyncio.gather(*(_devices(n) for n in nodes)))

    return dict(zip((n.name for n in nodes), asyncio.run(gather()), strict=True))


def runtime_claim_allocations(
    nodes: Sequence[NodeHandle],
) -> dict[str, dict[str, list[tuple[DeviceShare, ...]]]]:
    """node -> ResourceClaim uid -> the shares of each Runtime allocation held for the
    claim (one expected), from every node's Runtime simulator."""

    async def gather() -> list[list[Any]]:
        return list(await asyncio.gather(*(_allocations(n) for n in nodes)))

    out: dict[str, dict[str, list[tuple[DeviceShare, ...]]]] = {}
    for node, allocations in zip(nodes, asyncio.run(gather()), strict=True):
        per_claim: dict[str, list[tuple[DeviceShare, ...]]] = {}
        for a in allocations:
            if a.claim_uid:
                shares = tuple(from_request(d) for d in a.devices)
                per_claim.setdefault(a.claim_uid, []).append(shares)
        out[node.name] = per_claim
    return out


def node_device_index(api: k8s_client.ApiClient, protocol: Protocol) -> dict[str, str]:
    """Device ID -> `<kind>#<index>` from every node's inventory annotation."""
    core = k8s_client.CoreV1Api(api)
    out = {}
    for node in core.list_node().items:
        text = (node.metadata.annotations or {}).get(protocol.annotations.node_devices)
        if not text:
            continue
        try:
            devices = decode_inventory(text)
        except InventoryError:
            continue
        for d in devices:
            out[d.id] = f"{d.kind}#{d.index}"
            for m in d.mig:
                out[m.id] = f"{d.kind}#{d.index}/{m.profile}"
    return out


def describe_shares(shares: Iterable[DeviceShare], names: Mapping[str, str]) -> str:
    parts = []
    for s in shares:
        label = names.get(s.device_id, s.device_id)
        parts.append(label if s.whole else f"{label} {s.core_percent}%c/{s.memory_percent}%m")
    return ", ".join(parts)


def placement_table(rows: Sequence[Placement], names: Mapping[str, str]) -> str:
    """pod -> node -> device/slice, one line per container."""
    lines: list[TableLine] = [
        ("POD", "NODE", "PHASE", "CONTAINER", "DEVICES (scheduler = plugin = Runtime)")
    ]
    for row in sorted(rows, key=lambda r: r.name):
        containers = row.assigned or row.allocated or {c: () for c in row.requests}
        for container in sorted(containers or {"-": ()}):
            assigned = (row.assigned or {}).get(container, ())
            allocated = (row.allocated or {}).get(container, ())
            runtime = row.runtime.get(container, ())
            text = describe_shares(assigned or allocated, names)
            agree = _norm(assigned) == _norm(allocated) == _norm(runtime)
            if row.phase == "Running" and assigned and not agree:
                text += (
                    f"  [MISMATCH plugin: {describe_shares(allocated, names) or '-'};"
                    f" Runtime: {describe_shares(runtime, names) or '-'}]"
                )
            if not text:
                text = row.reason[:90] or "-"
            lines.append((row.name, row.node or "-", row.phase, container, text))
    return format_table(lines)


TableLine = tuple[str, str, str, str, str]
"""pod, node, phase, container, devices."""


def format_table(lines: Sequence[TableLine]) -> str:
    """The lines (the first the header) in aligned columns, the devices left as they are."""
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line[:4])) + "  " + line[4]
        for line in lines
    )


def _norm(shares: Iterable[DeviceShare]) -> list[tuple[str, int, int]]:
    out = []
    for s in shares:
        core, mem = s.core_percent, s.memory_percent
        if core in (0, 100) and mem in (0, 100):
            core = mem = 0
        out.append((s.device_id, core, mem))
    return sorted(out)


# -- metrics ----------------------------------------------------------------------------------


def scrape(url: str, timeout_s: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback URL
        text: str = resp.read().decode()
        return text


def pod_metric_lines(text: str, namespace: str, pod: str) -> list[str]:
    """The sample lines of one pod."""
    needle_ns, needle_pod = f'namespace="{namespace}"', f'pod="{pod}"'
    return [
        line
        for line in text.splitlines()
        if not line.startswith("#") and needle_pod in line and needle_ns in line
    ]


def sandbox_nodes_by_name(bed: Sandbox) -> dict[str, NodeHandle]:
    return {n.name: n for n in bed.nodes}


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


# -- the sharing invariant (docs/architecture.md, Sharing) ----------------------------------


def _pod_holdings(rows: Sequence[Placement], pick: Any) -> list[Holding]:
    """(node, pod, share) per device a pod holds, init containers' devices counted once."""
    out = []
    for r in rows:
        shares = pick(r)
        if r.node and shares:
            out += [(r.node, r.name, s) for s in pod_shares(shares, r.init_containers)]
    return out


def _annotation_violations(active: Sequence[Placement]) -> list[str]:
    """The sharing invariant over the scheduler's assignments and, separately, the Device
    Plugin's records of the active pods."""
    out = sharing_violations("scheduler", _pod_holdings(active, lambda r: r.assigned))
    return out + sharing_violations("device plugin", _pod_holdings(active, lambda r: r.allocated))


def invariant_violations(
    rows: Sequence[Placement],
    runtime: Mapping[str, Mapping[str, Mapping[str, tuple[DeviceShare, ...]]]],
    protocol: Protocol,
) -> list[str]:
    """The sharing invariant (docs/protocol.md) over the scheduler's annotations, the Device
    Plugin's records and the Runtime's allocations (node -> pod uid -> container ->
    shares), per pod; and for every admitted (Running) pod, the ledgers agree: the Runtime
    holds exactly what the plugin recorded per container, the plugin's devices are the
    scheduler's for the pod, and (when the kubelet's record was read) the kubelet gave each
    container exactly those device IDs. Empty when everything holds."""
    active = [r for r in rows if r.phase not in ("Succeeded", "Failed")]
    out = _annotation_violations(active)
    by_uid = {r.uid: r for r in rows}
    runtime_rows = []
    for node, pods in runtime.items():
        for uid, containers in pods.items():
            row = by_uid.get(uid)
            order = row.init_containers if row else ()
            runtime_rows += [(node, uid, s) for s in pod_shares(containers, order)]
    out += sharing_violations("runtime", runtime_rows)
    for r in active:
        if r.phase != "Running" or r.assigned is None:
            continue
        out += ledger_mismatches(r, protocol)
    return out


def ledger_mismatches(r: Placement, protocol: Protocol | None = None) -> list[str]:
    """Where a Running pod's scheduler assignment, Device Plugin record, Runtime
    allocation and (with `protocol`) kubelet record disagree."""
    out = []
    allocated = r.allocated or {}
    assigned_pod = _norm(pod_shares(r.assigned or {}, r.init_containers))
    allocated_pod = _norm(pod_shares(allocated, r.init_containers))
    if assigned_pod != allocated_pod:
        out.append(
            f"{r.namespace}/{r.name}: scheduler {assigned_pod}, device plugin {allocated_pod}"
        )
    for container in sorted(set(allocated) | set(r.runtime)):
        mine, held = _norm(allocated.get(container, ())), _norm(r.runtime.get(container, ()))
        if mine != held:
            out.append(
                f"{r.namespace}/{r.name} container {container}: device plugin {mine},"
                f" Runtime {held}"
            )
    if protocol is not None and r.kubelet_ids is not None:
        # The kubelet stops listing an init container once it has run to completion.
        listed = set(allocated) - (r.run_to_completion - set(r.kubelet_ids))
        for container in sorted(listed | set(r.kubelet_ids)):
            want = _kubelet_view(
                allocated.get(container, ()), r.requests.get(container, {}), protocol
            )
            got = _kubelet_view_ids(r.kubelet_ids.get(container, {}), protocol)
            if want != got:
                out.append(
                    f"{r.namespace}/{r.name} container {container}: device plugin {want},"
                    f" kubelet {got}"
                )
    return out


def _kubelet_view(
    shares: Iterable[DeviceShare], requests: Mapping[str, int], protocol: Protocol
) -> dict[str, list[str]]:
    """What the kubelet must record for a container given its served shares: whole IDs, and
    for a slice `<count> units of <device>` per core/memory resource it asks for."""
    res = protocol.resources
    out: dict[str, list[str]] = {}
    for s in shares:
        if s.whole:
            out.setdefault("whole", []).append(s.device_id)
            continue
        for name, pct in ((res.core, s.core_percent), (res.memory, s.memory_percent)):
            if requests.get(name, 0) > 0:
                out[name] = [f"{pct} units of {s.device_id}"]
    return {k: sorted(v) for k, v in out.items()}


def _kubelet_view_ids(ids: Mapping[str, list[str]], protocol: Protocol) -> dict[str, list[str]]:
    res = protocol.resources
    out: dict[str, list[str]] = {}
    for resource, devices in ids.items():
        if resource in (res.core, res.memory):
            parents = sorted({d.rpartition("::")[0] for d in devices})
            out[resource] = [f"{len(devices)} units of {','.join(parents)}"]
        else:
            out.setdefault("whole", []).extend(devices)
    return {k: sorted(v) for k, v in out.items()}


def observe(
    bed: Sandbox, api: k8s_client.ApiClient, namespaces: Sequence[str]
) -> tuple[list[Placement], dict[str, dict[str, dict[str, tuple[DeviceShare, ...]]]]]:
    """Placements of the namespaces' pods with the Runtime's and the kubelets' views, and
    the Runtime's view."""
    runtime = runtime_allocations(bed.nodes)
    merged = {uid: c for per_node in runtime.values() for uid, c in per_node.items()}
    pods = [p for ns in namespaces for p in list_pods(api, ns)]
    kubelet = kubelet_records(bed.nodes, bed.protocol)
    return placements(pods, bed.protocol, merged, kubelet), runtime


def runtime_namespaces(nodes: Sequence[NodeHandle]) -> set[str]:
    """Namespaces of the pods that hold Runtime allocations on any node."""

    async def gather() -> list[list[Any]]:
        return list(await asyncio.gather(*(_allocations(n) for n in nodes)))

    return {a.pod_namespace for allocations in asyncio.run(gather()) for a in allocations}


def share_conflicts(
    rows: Sequence[Placement], runtime: Mapping[str, Mapping[str, RuntimePod]]
) -> list[str]:
    """The sharing invariant alone (no ledger comparison): a device given whole to two
    pods, or sliced beyond 100 %, in the scheduler's assignments or the Device Plugin's
    records of the active pods, or in the Runtime's allocations (`runtime_records`: an
    init container's allocation overlaps its own pod's, also for a pod already deleted).
    Each line starts with its source."""
    active = [r for r in rows if r.phase not in ("Succeeded", "Failed")]
    out = _annotation_violations(active)
    by_uid = {r.uid: r for r in rows}
    runtime_rows = []
    for node, pods in runtime.items():
        for uid, pod in pods.items():
            row = by_uid.get(uid)
            # A pod already deleted: the Runtime knows its init containers, not its sidecars.
            gone = tuple((name, False) for name in sorted(pod.init_containers))
            order = row.init_containers if row else gone
            owner = f"{pod.namespace}/{pod.name}" + ("" if row else f" (gone, uid {uid})")
            runtime_rows += [(node, owner, s) for s in pod_shares(pod.containers, order)]
    out += sharing_violations("runtime", runtime_rows)
    return out


def kubelet_conflicts(rows: Sequence[Placement]) -> list[str]:
    """Device IDs the kubelets' PodResources records give to two Running pods of a node: a
    whole device or MIG instance, or the same slice unit (`<device>::<n>`)."""
    holders: dict[tuple[str, str, str], set[str]] = {}
    for r in rows:
        if r.phase != "Running" or not r.kubelet_ids:
            continue
        for ids in r.kubelet_ids.values():
            for resource, devices in ids.items():
                for d in devices:
                    key = (r.node, resource, d)
                    holders.setdefault(key, set()).add(f"{r.namespace}/{r.name}")
    # One line per device, resource and set of pods (not per slice unit).
    shared: dict[tuple[str, str, str, tuple[str, ...]], int] = {}
    for (node, resource, device), pods in holders.items():
        if len(pods) > 1:
            parent = device.rpartition("::")[0] or device
            where = (node, resource, parent, tuple(sorted(pods)))
            shared[where] = shared.get(where, 0) + 1
    return [
        f"kubelet: {resource} {device} on {node} ({count} IDs) given to {list(pods)}"
        for (node, resource, device, pods), count in sorted(shared.items())
    ]
