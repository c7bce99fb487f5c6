"""The demo on DRA nodes (`lj-sandbox up --dra`): ResourceClaimTemplates for TDM
core/memory slices, a whole GPU, a MIG instance and a whole PPU, pods that use them (the
default scheduler, kube-scheduler, allocates the claims; the Scheduler Framework leaves
claim pods alone), and the ledgers read back: the claims' allocations, the Runtime's
claim allocations and the kubelet's PodResources.

kube-scheduler 1.34.4 re-checks a request's capacity against a node's first TDM GPU
(docs/dra.md): the pods are pinned by kind so that a node's first GPU takes the slices
or one whole device, and nothing is asked of that node's TDM GPUs after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s_client

from lj_runtimekit.deviceplugin.internal.dra.classes import profile_selector
from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY
from lj_runtimekit.proto.pkg.protocol import DeviceShare, Protocol
from lj_runtimekit.sandbox import workload
from lj_runtimekit.sandbox.bed import RESOURCE_GROUP, RESOURCE_VERSION, NodeHandle, Sandbox
from lj_runtimekit.testkit.dra import allocated_shares, claim_pod, claim_template, exactly
from lj_runtimekit.testkit.invariant import Holding, sharing_violations

CLAIM = "dev"
"""The pod claim name of every demo pod (its one container uses it)."""


def _first(nodes: Sequence[NodeHandle], kind: str, skip: int = 0) -> NodeHandle | None:
    found = [n for n in nodes if n.kind.startswith(kind)]
    return found[skip] if len(found) > skip else None


def demo_workload(
    protocol: Protocol, nodes: Sequence[NodeHandle], namespace: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ResourceClaimTemplates and the pods using them (one template per pod, named
    after it), for the node kinds the bed has: three slices filling the first TDM node's
    first GPU (memory of an 80 GiB GPU), one whole GPU on the MIG node's first (TDM) GPU
    or on a second TDM node, a 1g.10gb MIG instance, a whole PPU."""
    dra = protocol.dra
    wanted: list[tuple[str, NodeHandle | None, dict[str, Any]]] = [
        (
            name,
            _first(nodes, "tdm"),
            exactly("s", dra.share_class("gpu"), capacity={CORES: cores, MEMORY: memory}),
        )
        for name, cores, memory in (
            ("slice-a", "30", "20Gi"),
            ("slice-b", "50", "40Gi"),
            ("slice-c", "20", "20Gi"),
        )
    ]
    wanted += [
        (
            "whole-1",
            _first(nodes, "mig") or _first(nodes, "tdm", 1),
            exactly("g", dra.whole_class("gpu")),
        ),
        (
            "mig-1g",
            _first(nodes, "mig"),
            exactly("m", dra.mig_class, selector=profile_selector(protocol, "1g.10gb")),
        ),
        ("ppu-1", _first(nodes, "ppu"), exactly("p", dra.whole_class("ppu"))),
    ]
    templates, pods = [], []
    for name, node, request in wanted:
        if node is None:
            continue
        templates.append(claim_template(name, [request], namespace))
        pods.append(
            claim_pod(
                name,
                {CLAIM: name},
                containers=({"main": (CLAIM,)},),
                namespace=namespace,
                node=node.name,
            )
        )
    return templates, pods


def create_templates(api: k8s_client.ApiClient, templates: Sequence[Mapping[str, Any]]) -> None:
    custom = k8s_client.CustomObjectsApi(api)
    for obj in templates:
        custom.create_namespaced_custom_object(
            RESOURCE_GROUP,
            RESOURCE_VERSION,
            obj["metadata"]["namespace"],
            "resourceclaimtemplates",
            dict(obj),
        )


def list_claims(api: k8s_client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    custom = k8s_client.CustomObjectsApi(api)
    listed = custom.list_namespaced_custom_object(
        RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims"
    )
    items: list[dict[str, Any]] = listed.get("items") or []
    return items


@dataclass
class ClaimPlacement:
    """One pod with claims and what each ledger says of them."""

    namespace: str
    name: str
    node: str
    phase: str
    reason: str
    uses: dict[str, list[str]]
    """Container -> the ResourceClaims (by name) it uses."""
    allocated: dict[str, list[tuple[str, DeviceShare]]] = field(default_factory=dict)
    """Claim -> (published device name, Runtime share) per device of its allocation."""
    runtime: dict[str, list[tuple[DeviceShare, ...]]] = field(default_factory=dict)
    """Claim -> the node's Runtime allocations held for it."""
    kubelet: dict[str, dict[str, list[tuple[str, str, str]]]] | None = None
    """Container -> claim -> (driver, pool, device) from PodResources; None when the
    kubelet does not list the pod."""


def _reason(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "")
    return str(status.get("reason") or "")


def pod_claims(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod claim name -> ResourceClaim name: named in the spec, or made from a template (the
    pod's status names it)."""
    out = {
        c["name"]: c["resourceClaimName"]
        for c in (pod.get("spec") or {}).get("resourceClaims") or ()
        if c.get("resourceClaimName")
    }
    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        out[s["name"]] = s.get("resourceClaimName") or ""
    return out


def observe(
    bed: Sandbox, api: k8s_client.ApiClient, namespace: str
) -> tuple[list[ClaimPlacement], list[str]]:
    """The namespace's pods with the claims' allocations, the Runtimes' claim allocations
    and the kubelets' PodResources, and where they disagree: a device shared past what it
    holds (in the claims or in the Runtime), a Runtime allocation for no live claim, and
    for every Running pod a claim allocated off its node, not held exactly once by the
    Runtime with the allocation's shares, or not reported by the kubelet with the
    allocation's devices for each (regular) container using it. Empty when all agree."""
    driver = bed.protocol.dra.driver
    claims = {c["metadata"]["name"]: c for c in list_claims(api, namespace)}
    inventories = workload.runtime_inventories(bed.nodes)
    held = workload.runtime_claim_allocations(bed.nodes)
    kubelet = workload.kubelet_claim_records(bed.nodes)
    problems: list[str] = []
    allocated: dict[str, list[tuple[str, DeviceShare]]] = {}
    claim_holdings: list[Holding] = []
    for name, claim in claims.items():
        if not (claim.get("status") or {}).get("allocation"):
            continue
        results = claim["status"]["allocation"]["devices"]["results"]
        try:
            resolved = allocated_shares(claim, driver, inventories)
        except AssertionError as exc:
            problems.append(f"claim {namespace}/{name}: {exc}")
            continue
        allocated[name] = [(r["device"], s) for r, (_, _, s) in zip(results, resolved, strict=True)]
        claim_holdings += [(pool, name, s) for pool, _, s in resolved]
    problems += sharing_violations("claims", claim_holdings)
    uids = {c["metadata"]["uid"]: name for name, c in claims.items()}
    runtime_holdings: list[Holding] = []
    for node, per_claim in held.items():
        for uid, allocations in per_claim.items():
            owner = uids.get(uid)
            if owner is None:
                problems.append(f"runtime: claim uid {uid} on {node} has no live claim")
            runtime_holdings += [(node, owner or uid, s) for a in allocations for s in a]
    problems += sharing_violations("runtime", runtime_holdings)
    rows = []
    for pod in workload.list_pods(api, namespace):
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        by_pod_claim = pod_claims(pod)
        uses = {
            c["name"]: [by_pod_claim.get(r["name"], "") for r in c["resources"].get("claims", ())]
            for c in spec.get("containers") or ()
        }
        row = ClaimPlacement(
            namespace=namespace,
            name=meta["name"],
            node=spec.get("nodeName") or "",
            phase=status.get("phase") or "",
            reason=_reason(pod),
            uses=uses,
            kubelet=kubelet.get((namespace, meta["name"])),
        )
        for used_claim in {c for used in uses.values() for c in used if c in allocated}:
            uid = claims[used_claim]["metadata"]["uid"]
            row.allocated[used_claim] = allocated[used_claim]
            row.runtime[used_claim] = held.get(row.node, {}).get(uid, [])
        rows.append(row)
        if row.phase == "Running":
            problems += ledger_mismatches(row, claims, driver)
    return rows, problems


def ledger_mismatches(
    row: ClaimPlacement, claims: Mapping[str, Mapping[str, Any]], driver: str
) -> list[str]:
    """Where a Running pod's claims (`claims`: the namespace's ResourceClaims by name), the
    Runtime's allocations for them and the kubelet's PodResources disagree."""
    where = f"{row.namespace}/{row.name}"
    out = [
        f"{where} container {container}: claim {claim or '?'} is not allocated"
        for container, used in sorted(row.uses.items())
        for claim in used
        if claim not in row.allocated
    ]
    for claim, devices in sorted(row.allocated.items()):
        pools = {r["pool"] for r in _results(claims, claim)}
        if pools != {row.node}:
            out.append(f"{where}: claim {claim} allocated in pools {sorted(pools)}, not {row.node}")
        want = _sorted(s for _, s in devices)
        got = [_sorted(a) for a in row.runtime.get(claim, [])]
        if got != [want]:
            out.append(f"{where}: claim {claim} {want}, Runtime {got}")
    if row.kubelet is None:
        return [*out, f"{where}: the kubelet of {row.node} does not list the pod"]
    for container, used in sorted(row.uses.items()):
        want_ids = {
            c: sorted((driver, r["pool"], r["device"]) for r in _results(claims, c)) for c in used
        }
        got_ids = {c: sorted(d) for c, d in row.kubelet.get(container, {}).items()}
        if got_ids != want_ids:
            out.append(f"{where} container {container}: claims {want_ids}, kubelet {got_ids}")
    return out


def _results(claims: Mapping[str, Mapping[str, Any]], name: str) -> list[dict[str, Any]]:
    claim = claims.get(name) or {}
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results: list[dict[str, Any]] = allocation.get("devices", {}).get("results") or []
    return results


def _sorted(shares: Any) -> list[DeviceShare]:
    return sorted(shares, key=lambda s: (s.device_id, s.core_percent, s.memory_percent))


def placement_table(rows: Sequence[ClaimPlacement]) -> str:
    """pod -> node -> claimed devices (published names), one line per container."""
    lines: list[workload.TableLine] = [
        ("POD", "NODE", "PHASE", "CONTAINER", "DEVICES (claim = Runtime = kubelet)")
    ]
    for row in sorted(rows, key=lambda r: r.name):
        for container, used in sorted(row.uses.items()):
            devices = [d for c in used for d in row.allocated.get(c, [])]
            names = {s.device_id: name for name, s in devices}
            text = workload.describe_shares((s for _, s in devices), names)
            lines.append(
                (row.name, row.node or "-", row.phase, container, text or row.reason[:90] or "-")
            )
    return workload.format_table(lines)
