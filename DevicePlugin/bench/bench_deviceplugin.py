"""Device Plugin benchmark: Allocate latency, first ListAndWatch, health and re-registration.

Runs the real plugin process against the Runtime simulator (tdm-8gpu: 8 GPUs)
and the kubelet shim on the v1beta1 protocol: 100 slice pods admitted one after
the other, each listed in the kubelet's `/pods` as its admission starts (as the
kubelet's pod manager does), the earlier ones staying listed. Allocate is timed
at the kubelet side, so every call includes the plugin's pod lookup over HTTP and
the Runtime's Allocate.
`plugin_cpu_ms_per_call` is the plugin's CPU time per call (GetPreferredAllocation
and Allocate alike), which machine load does not inflate; `load_avg_1m` says how
busy the machine was.

    uv run python DevicePlugin/bench/bench_deviceplugin.py --out bench/parts/deviceplugin.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from lj_runtimekit.deviceplugin.internal.plugin.server import socket_name
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.testkit.kubelet.bed import (
    CORE,
    GPU,
    MEMORY,
    RES,
    Bed,
    node_bed,
)

PODS = 100
SLICE = 7  # 100 pods x 7 % over 8 GPUs: at most 13 pods (91 %) per GPU


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def allocate_latencies(bed: Bed) -> tuple[list[float], list[float]]:
    """Admit 100 slice pods the kubelet's way; time each Allocate and GetPreferredAllocation."""
    pods = [
        bed.pod(
            {"main": {CORE: SLICE, MEMORY: SLICE}},
            {"main": [DeviceShare(bed.gpu(i % 8), SLICE, SLICE)]},
            listed=False,
        )
        for i in range(PODS)
    ]
    allocate: list[float] = []
    preferred: list[float] = []
    kubelet = bed.kubelet
    for pod in pods:
        bed.pods.put(pod)
        for resource in (CORE, MEMORY):
            used = kubelet.in_use.setdefault(resource, {})
            available = [i for i in kubelet.healthy(resource) if i not in used]
            t0 = time.perf_counter()
            ids = await kubelet.preferred(resource, available, SLICE)
            t1 = time.perf_counter()
            await kubelet.allocate(resource, [ids])
            t2 = time.perf_counter()
            for i in ids:
                used[i] = f"{pod['metadata']['uid']}/main"
            preferred.append((t1 - t0) * 1000)
            allocate.append((t2 - t1) * 1000)
    allocations = await bed.allocations()
    if len(allocations) != PODS:
        raise SystemExit(f"expected {PODS} allocations, the Runtime holds {len(allocations)}")
    return allocate, preferred


async def list_and_watch_first(bed: Bed, rounds: int = 10) -> list[float]:
    """Open ListAndWatch on the core resource (800 devices) and time the first message."""
    out = []
    target = f"unix:{bed.plugin_dir / socket_name(CORE)}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        await stub.GetDevicePluginOptions(api_pb2.Empty())
        for _ in range(rounds):
            t0 = time.perf_counter()
            call = stub.ListAndWatch(api_pb2.Empty())
            first = await call.read()
            out.append((time.perf_counter() - t0) * 1000)
            call.cancel()
            assert isinstance(first, api_pb2.ListAndWatchResponse)
            assert len(first.devices) == 800
    return out


async def health_to_kubelet(bed: Bed, rounds: int = 6) -> list[float]:
    """Time from the Runtime's health change to the kubelet seeing it on ListAndWatch."""
    out = []
    device = bed.gpu(5)
    for n in range(rounds):
        healthy = n % 2 == 1
        want = "Healthy" if healthy else "Unhealthy"
        t0 = time.perf_counter()
        await asyncio.to_thread(bed.sim.set_health, device, healthy, "" if healthy else "XID 79")
        await bed.kubelet.wait_for(
            lambda want=want: bed.kubelet.devices(GPU)[device].health == want,  # type: ignore[misc]
            10,
        )
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def reregister(bed: Bed, rounds: int = 3) -> list[float]:
    """Time from a kubelet restart to every resource registered again and listed."""
    resources = (GPU, CORE, MEMORY, RES.ppu, RES.amd)
    out = []
    for _ in range(rounds):
        t0 = time.monotonic()
        await bed.kubelet.restart()
        await bed.kubelet.wait_registered(resources, 10, since=t0)
        out.append((time.monotonic() - t0) * 1000)
    return out


async def run() -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="ljb", dir="/tmp"))
    try:
        async with node_bed(root, "tdm-8gpu", plugin_args=["--log-level=WARNING"]) as bed:
            await bed.kubelet.wait_for(lambda: len(bed.kubelet.devices(MEMORY)) == 800, 30)
            cpu0 = cpu_seconds(bed.plugin.pid)
            allocate, preferred = await allocate_latencies(bed)
            cpu_per_call = (cpu_seconds(bed.plugin.pid) - cpu0) * 1000 / (2 * len(allocate))
            law = await list_and_watch_first(bed)
            health = await health_to_kubelet(bed)
            rereg = await reregister(bed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "allocate_p50_ms": round(statistics.median(allocate), 3),
        "allocate_p99_ms": round(pct(allocate, 0.99), 3),
        "allocate_max_ms": round(max(allocate), 3),
        "allocate_calls": len(allocate),
        "preferred_allocation_p50_ms": round(statistics.median(preferred), 3),
        "preferred_allocation_p99_ms": round(pct(preferred, 0.99), 3),
        "pods_on_node": PODS,
        "plugin_cpu_ms_per_call": round(cpu_per_call, 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count() or 0,
        "list_and_watch_first_ms": round(statistics.median(law), 3),
        "list_and_watch_first_max_ms": round(max(law), 3),
        "health_to_kubelet_ms": round(statistics.median(health), 3),
        "health_to_kubelet_max_ms": round(max(health), 3),
        "kubelet_restart_reregister_ms": round(statistics.median(rereg), 3),
        "kubelet_restart_reregister_max_ms": round(max(rereg), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/parts/deviceplugin.json"))
    args = parser.parse_args()
    results = asyncio.run(run())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    width = max(len(k) for k in results)
    for key, value in sorted(results.items()):
        print(f"deviceplugin.{key:<{width}} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
