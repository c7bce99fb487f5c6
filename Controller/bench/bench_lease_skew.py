"""Leader election with a skewed holder: a holder whose wall clock runs `--skew` seconds
behind (its renewTime always that far in the past, more than the lease duration) renews
the Controller's Lease on a real kube-apiserver while `lj-controller` waits as the second
candidate. Counts the takeovers while the holder renews (must be 0), then kills the holder
(no release) and times the candidate's takeover (about one lease duration). Merges its keys
into the Controller's part (bench/parts/controller.json).

    uv run python Controller/bench/bench_lease_skew.py --out bench/parts/controller.json
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig
from lj_runtimekit.proto.pkg.kube import KubeClient, KubeError
from lj_runtimekit.testkit.controller import OperatorProcess
from lj_runtimekit.testkit.waits import wait_for

NAMESPACE = "lj-bench-lease-skew"
LEASE = "lj-runtimekit-controller"
HOLDER = "skewed-holder"
TIMING = ("--lease-duration=15", "--lease-renew-deadline=10", "--lease-retry-period=2")
"""The Controller's defaults, for the candidate and the holder alike."""

# The holder: the shared elector in its own process, its clock set back by argv[3] seconds.
HOLDER_CODE = f"""
import sys, threading, time
real = time.time
time.time = lambda: real() - float(sys.argv[3])
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.leaderelection import LeaderElector, LeaseConfig
kube = KubeClient.connect(sys.argv[1])
config = LeaseConfig(sys.argv[2], "{LEASE}", "{HOLDER}", 15.0, 10.0, 2.0)
elector, stop = LeaderElector(kube, config), threading.Event()
assert elector.acquire(stop)
print("leading", flush=True)
print("lost" if elector.renew_until_lost(stop) else "stopped", flush=True)
"""


def lease_spec(kube: KubeClient) -> dict[str, object]:
    """The Lease's spec ({} while there is none)."""
    try:
        lease = kube.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
        )
    except KubeError as exc:
        if exc.status == 404:
            return {}
        raise
    spec: dict[str, object] = lease.get("spec") or {}
    return spec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skew", type=float, default=20.0, help="seconds the holder is behind")
    parser.add_argument("--seconds", type=float, default=60.0, help="time the holder renews")
    parser.add_argument("--out", type=Path, default=Path("bench/parts/controller.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lj-bench-lease-skew-"))
    with ControlPlane(ControlPlaneConfig()) as cp:
        kube = KubeClient.connect(str(cp.kubeconfig_path))
        kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER_CODE, str(cp.kubeconfig_path), NAMESPACE, str(args.skew)],
            stdout=subprocess.PIPE,
            text=True,
        )
        candidate = OperatorProcess(
            cp.kubeconfig_path, NAMESPACE, work / "controller.log", "--leader-elect=true", *TIMING
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "leading", "the holder did not lead"
            spec = lease_spec(kube)
            transitions = int(str(spec.get("leaseTransitions") or 0))
            renew_behind_s = time.time() - _parse(str(spec["renewTime"]))
            candidate.start()
            wait_for(
                lambda: "waiting for leadership" in candidate.log(),
                60,
                "the candidate to wait for the Lease",
                describe=lambda: candidate.log()[-2000:],
            )
            renewals = 0
            last_renew = spec.get("renewTime")
            end = time.monotonic() + args.seconds
            while time.monotonic() < end and holder.poll() is None:
                spec = lease_spec(kube)
                if spec.get("renewTime") != last_renew:
                    renewals += 1
                    last_renew = spec.get("renewTime")
                time.sleep(0.5)  # sampling the Lease's renewals, not waiting on a condition
            spec = lease_spec(kube)
            takeovers = int(str(spec.get("leaseTransitions") or 0)) - transitions
            held = holder.poll() is None and spec.get("holderIdentity") == HOLDER
            print(f"holder renewed {renewals} times, takeovers {takeovers}", flush=True)

            holder.send_signal(signal.SIGKILL)  # no release: the Lease has to expire
            holder.wait()
            killed = time.monotonic()
            wait_for(
                lambda: lease_spec(kube).get("holderIdentity") not in (HOLDER, None),
                120,
                "the candidate to take the expired Lease",
                describe=lambda: candidate.log()[-2000:],
            )
            failover_s = time.monotonic() - killed
            wait_for(
                lambda: "became leader" in candidate.log(),
                30,
                "the candidate to lead",
                describe=lambda: candidate.log()[-2000:],
            )
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            if candidate.proc is not None:
                candidate.stop()
            kube.close()
    result = {
        "skewed_leader_takeovers": takeovers,
        "skewed_leader_held": int(held),
        "skewed_leader_renewals": renewals,
        "skewed_leader_skew_s": args.skew,
        "skewed_leader_renew_time_behind_s": round(renew_behind_s, 1),
        "skewed_leader_observed_s": args.seconds,
        "skewed_leader_failover_after_kill_s": round(failover_s, 1),
    }
    merged = json.loads(args.out.read_text()) if args.out.exists() else {}
    merged.update(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if takeovers == 0 and held else 1


def _parse(stamp: str) -> float:
    """Seconds since the epoch of a MicroTime (`2026-01-02T03:04:05.123456Z`)."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


if __name__ == "__main__":
    sys.exit(main())
