"""What each API request of a device pod's placement costs the API server.

One control plane (etcd, kube-apiserver; nothing else running against it),
`--requests` requests of each kind from 32 client threads, `--rounds` rounds
(the reported value is the median). A request's cost is the API server's
CPU seconds (`process_cpu_seconds_total` from its /metrics) over the requests
of that kind, divided by their number:

- `apiserver_cpu_ms_per_pod_create`: a one-GPU pod is created;
- `apiserver_cpu_ms_per_binding`: lj-scheduler's Binding, carrying the
  placement annotations (assignment, assume time, `bind-phase: allocating`);
- `apiserver_cpu_ms_per_record`: the Device Plugin's record after Allocate
  (`allocated-devices`, `bind-phase: allocated`), the strategic merge patch
  it sends; `apiserver_cpu_ms_per_record_merge_patch` (how bench_scheduler's
  BindWatch plays it) and `..._json_patch` are the same change sent as the
  other patch types;
- `apiserver_cpu_ms_per_event`: lj-scheduler's `Scheduled` event (core/v1);
- `apiserver_cpu_ms_per_pod_get`: a GET of one pod (what every request pays
  for TLS, authentication, authorization, admission bookkeeping and the
  answer's encoding, beside the write itself).

The keys are merged into the `--out` part file. This is what the whole-GPU
rounds of bench_scheduler.py pay per pod at the API server, one request at a
time: it explains where their rate goes (SchedulerFramework/README.md,
Performance).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.proto.pkg.kube import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    KubeClient,
    api_time,
)
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.schedulerframework.internal.scheduler.events import EventRecord, event_body
from lj_runtimekit.schedulerframework.internal.scheduler.scheduler import binding_body
from lj_runtimekit.testkit.benchpart import write_part

sys.path.insert(0, str(Path(__file__).parent))
from bench_scheduler import (  # type: ignore[import-not-found]  # a script beside this one
    apiserver_counters,
    log,
    make_runtime_class,
    pod_body,
)

P = load_protocol()
NS = "bench-writes"
ASSIGNMENT = '{"main":[{"id":"GPU-0f3c7a7e-1b2d-4c5e-9f00-000000000001"}]}'
JSON_PATCH = "application/json-patch+json"


def cost_ms(kube: KubeClient, n: int, one: Callable[[int], object]) -> float:
    """API server CPU ms per request over `n` calls of `one(i)` from 32 threads."""
    before, _ = apiserver_counters(kube)
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(n)))
    after, _ = apiserver_counters(kube)
    return float((after - before) * 1000 / n)


def one_round(kube: KubeClient, prefix: str, n: int) -> dict[str, float]:
    """Each kind of request `n` times, on pods `<prefix><i>`."""
    a = P.annotations
    pods = f"/api/v1/namespaces/{NS}/pods"

    uids: dict[int, str] = {}

    def create(i: int) -> object:
        made = kube.request(
            "POST", pods, body=pod_body(f"{prefix}{i}", "none", {P.resources.gpu: "1"})
        )
        uids[i] = made["metadata"]["uid"]
        return made

    def bind(i: int) -> object:
        annotations = {
            a.assigned_devices: ASSIGNMENT,
            a.assume_time: str(time.time_ns()),
            a.bind_phase: "allocating",
        }
        body = binding_body(NS, f"{prefix}{i}", uids[i], "gpu-0000", annotations)
        return kube.request("POST", f"{pods}/{prefix}{i}/binding", body=body)

    def record(i: int, content_type: str, key: str = a.allocated_devices) -> object:
        if content_type == JSON_PATCH:
            escaped = key.replace("~", "~0").replace("/", "~1")
            body: Any = [
                {"op": "add", "path": f"/metadata/annotations/{escaped}", "value": ASSIGNMENT}
            ]
        else:
            body = {"metadata": {"annotations": {key: ASSIGNMENT}}}
        return kube.request("PATCH", f"{pods}/{prefix}{i}", body=body, content_type=content_type)

    def event(i: int) -> object:
        name = f"{prefix}{i}"
        message = f"Successfully assigned {NS}/{name} to gpu-0000"
        r = EventRecord(NS, name, uids[i], "Normal", "Scheduled", message)
        body = event_body(r, f"{name}.{time.time_ns():x}", api_time(), "lj-scheduler", "bench")
        return kube.request("POST", f"/api/v1/namespaces/{NS}/events", body=body)

    out = {"pod_create": cost_ms(kube, n, create), "binding": cost_ms(kube, n, bind)}
    out["record"] = cost_ms(kube, n, lambda i: record(i, STRATEGIC_MERGE_PATCH))
    # the other patch types write other keys, so that each is a change
    out["record_merge_patch"] = cost_ms(
        kube, n, lambda i: record(i, MERGE_PATCH, "bench/merge-patch")
    )
    out["record_json_patch"] = cost_ms(kube, n, lambda i: record(i, JSON_PATCH, "bench/json-patch"))
    out["event"] = cost_ms(kube, n, event)
    out["pod_get"] = cost_ms(kube, n, lambda i: kube.request("GET", f"{pods}/{prefix}{i}"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/parts/scheduler.json")
    ap.add_argument("--requests", type=int, default=1000, help="requests of each kind a round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = ControlPlaneConfig(controller_manager=False, scheduler=False, kwok=False, verbosity=0)
    rounds: list[dict[str, float]] = []
    with ControlPlane(cfg) as cp:
        kube = KubeClient.connect(str(cp.kubeconfig_path), pool_size=40)
        make_runtime_class(kube)
        # No controller manager (its pod GC would remove pods bound to nodes that do not
        # exist), so the namespace's ServiceAccount is made here.
        for path, kind, name in (
            ("/api/v1/namespaces", "Namespace", NS),
            (f"/api/v1/namespaces/{NS}/serviceaccounts", "ServiceAccount", "default"),
        ):
            kube.request(
                "POST", path, body={"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}
            )
        for r in range(args.rounds):
            rounds.append(one_round(kube, f"r{r}-", args.requests))
            log(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{k} {v:.2f} ms" for k, v in rounds[-1].items())
            )
    write_part(
        Path(args.out),
        {
            f"apiserver_cpu_ms_per_{k}": round(statistics.median(r[k] for r in rounds), 2)
            for k in rounds[0]
        },
        "scheduler",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
