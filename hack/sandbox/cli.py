"""lj-sandbox: the whole LJ Runtime Kit on one machine, no GPU, no cluster.

lj-sandbox up [--nodes N] [--state-dir DIR] [--no-demo] [--exit-after-demo]
    start the bed (control plane + KWOK, N Lingjun nodes each with a Runtime simulator,
    kubelet shim, Device Plugin and Exporter, plus the Scheduler Framework and the
    Controller), run the demo, print the placement table and metrics, stay up until Ctrl-C
lj-sandbox down [--state-dir DIR]
    stop a sandbox (also one left over by a killed `up`) and remove its state directory
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from lj_runtimekit.envtest import ControlPlaneError, ToolsMissingError
from lj_runtimekit.sandbox import workload
from lj_runtimekit.sandbox.bed import (
    DEFAULT_STATE_DIR,
    STATE_FILE,
    Sandbox,
    SandboxConfig,
    SandboxError,
    cleanup_leftovers,
)
from lj_runtimekit.testkit.waits import NotYet, WaitTimeout, wait_for

DEMO_NAMESPACE = "sandbox-demo"


def _say(message: str) -> None:
    print(f"[sandbox {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise SandboxError(f"{name}={value!r} is not a number") from None


def run_demo(bed: Sandbox) -> str:
    """Enable the nodes by label, submit the workload, print where it landed; the table."""
    protocol = bed.protocol
    names = [n.name for n in bed.nodes]
    with bed.api_client() as api:
        with bed.step(
            f"label {len(names)} nodes {protocol.labels.enable}=true; enable Jobs run"
            " the Job Agent against each node's Runtime and are cleaned",
            bed.log_dir / "controller.log",
        ):
            workload.label_nodes(api, names, protocol.labels.enable, "true")
            workload.wait_feature_state(api, names, "enabled")
            for node, (enabled, by) in workload.runtime_feature_states(bed.nodes).items():
                _say(f"  {node}: Runtime features {'on' if enabled else 'OFF'} (set by {by})")
        pods = workload.demo_pods(protocol)
        with bed.step(
            f"submit {len(pods)} pods (TDM slices, whole GPUs, a MIG instance,"
            " PPUs, a 4-pod JobSet-style gang)",
            bed.log_dir / "scheduler.log",
        ):
            workload.ensure_namespace(api, DEMO_NAMESPACE)
            workload.create_pods(api, DEMO_NAMESPACE, pods)
            listed = workload.wait_pods(
                api, DEMO_NAMESPACE, [p["metadata"]["name"] for p in pods], timeout_s=120
            )
        with bed.step(
            "read placements (scheduler annotation, Device Plugin record, Runtime, kubelet)"
        ):
            runtime = workload.runtime_allocations(bed.nodes)
            merged = {uid: c for per_node in runtime.values() for uid, c in per_node.items()}
            kubelet = workload.kubelet_records(bed.nodes, protocol)
            rows = workload.placements(listed, protocol, merged, kubelet)
            table = workload.placement_table(rows, workload.node_device_index(api, protocol))
            problems = workload.invariant_violations(rows, runtime, protocol)
        print("\n" + table + "\n", flush=True)
        _say(
            "ledgers agree for every pod (scheduler, Device Plugin, Runtime, the kubelet's"
            " PodResources)"
            if not problems
            else "LEDGER MISMATCH:\n  " + "\n  ".join(problems)
        )
        gang = [r for r in rows if r.name.startswith("train-")]
        placed = sum(1 for r in gang if r.phase == "Running")
        _say(
            f"gang 'train': {placed}/{len(gang)} members Running"
            + (" (all or nothing)" if placed in (0, len(gang)) else " (PARTIAL gang)")
        )
        with bed.step("scrape each node's exporter for the pods' metrics"):
            _print_metrics(bed, rows)
    return table


def _print_metrics(bed: Sandbox, rows: Sequence[workload.Placement]) -> None:
    nodes = workload.sandbox_nodes_by_name(bed)
    running = [r for r in rows if r.phase == "Running" and r.node in nodes]

    def all_seen() -> dict[str, list[str]] | NotYet:
        texts = {n: workload.scrape(nodes[n].metrics_url) for n in {r.node for r in running}}
        lines = {
            r.name: workload.pod_metric_lines(texts[r.node], r.namespace, r.name) for r in running
        }
        missing = [name for name, found in lines.items() if not found]
        return lines if not missing else NotYet(f"no series yet for {missing}")

    lines = wait_for(all_seen, 30, "per-pod series on the exporters")
    for row in running:
        print(f"  {row.name} ({nodes[row.node].metrics_url}):")
        for line in lines[row.name][:3]:
            print(f"    {line}")
    print(flush=True)


def _instructions(bed: Sandbox) -> None:
    print(f"""
The sandbox is up (state and logs in {bed.state_dir}).

  export KUBECONFIG={bed.kubeconfig}
  $(uv run lj-envtest tools)/kubectl get nodes -L {bed.protocol.labels.device_kind}
  $(uv run lj-envtest tools)/kubectl -n {DEMO_NAMESPACE} get pods -o wide
""")
    for node in bed.nodes:
        print(
            f"  {node.name:<10} metrics {node.metrics_url}  kubelet {node.pods_url}"
            f"  Runtime: uv run lj-runtime-ctl --socket-dir {node.sim_dir} devices"
        )
    print(
        f"\n  logs: {bed.log_dir}/<node>-<component>.log\n\nPress Ctrl-C to stop"
        " (or run `make sandbox-down` elsewhere).",
        flush=True,
    )


def up(args: argparse.Namespace) -> int:
    t0 = args.t0 if args.t0 else time.time()
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    config = SandboxConfig(nodes=args.nodes, state_dir=args.state_dir, keep_state=True)
    bed = Sandbox(config, progress=_say)
    _say(f"starting {args.nodes} Lingjun nodes under {args.state_dir}")
    try:
        bed.start()
        _say(f"bed up in {bed.started_s:.1f}s")
        if not args.no_demo:
            run_demo(bed)
            _say(f"placement table reached {time.time() - t0:.1f}s after start")
        if args.exit_after_demo:
            return 0
        _instructions(bed)
        while not stop.wait(2.0):
            for comp in bed.all_components():
                if not comp.running:
                    _say(f"{comp.name} exited; its log: {comp.log_path}")
                    raise SandboxError(f"{comp.name} exited; see {comp.log_path}")
    except KeyboardInterrupt:
        _say("stopping ...")
    except (SandboxError, ControlPlaneError, ToolsMissingError, WaitTimeout) as exc:
        _say(f"FAILED: {exc}")
        _say(f"logs kept in {bed.log_dir} (run `make sandbox-down` to clean up)")
        bed.stop(failed=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    bed.stop(failed=False)
    _say(f"stopped; logs kept in {bed.log_dir} until `make sandbox-down`")
    return 0


def down(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    state_file = state_dir / STATE_FILE
    if state_file.exists():
        with contextlib.suppress(json.JSONDecodeError, OSError, ValueError):
            pid = int(json.loads(state_file.read_text()).get("pid", 0))
            if pid and pid != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        os.kill(pid, 0)
                        time.sleep(0.2)
    killed = cleanup_leftovers(state_dir) if state_dir.exists() else []
    if state_dir.exists():
        shutil.rmtree(state_dir)
        _say(f"sandbox down: {len(killed)} leftover process groups killed, {state_dir} removed")
    else:
        _say(f"no sandbox state in {state_dir}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lj-sandbox", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start the sandbox and run the demo")
    u.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="Lingjun nodes (env LJ_SANDBOX_NODES, default 4; kinds cycle TDM, MIG, PPU)",
    )
    u.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"default {DEFAULT_STATE_DIR}"
        " (env LJ_SANDBOX_DIR; keep it short: unix sockets live there)",
    )
    u.add_argument("--no-demo", action="store_true", help="start the bed only")
    u.add_argument("--exit-after-demo", action="store_true", help="stop after the demo")
    u.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    d = sub.add_parser("down", help="stop the sandbox and remove its state")
    d.add_argument("--state-dir", type=Path, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.state_dir is None:
            args.state_dir = Path(os.environ.get("LJ_SANDBOX_DIR") or DEFAULT_STATE_DIR)
        if len(str(args.state_dir)) > 40:
            raise SandboxError(
                f"--state-dir {args.state_dir} is too long: unix socket paths under it must"
                " stay below 108 bytes"
            )
        if args.command == "down":
            return down(args)
        if args.nodes is None:
            args.nodes = _env_int("LJ_SANDBOX_NODES", 4)
        if not 1 <= args.nodes <= 64:
            raise SandboxError(f"--nodes must be in 1..64, got {args.nodes}")
        return up(args)
    except SandboxError as exc:
        print(f"lj-sandbox: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
