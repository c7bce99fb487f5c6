"""lj-sandbox: the whole LJ Runtime Kit on one machine, no GPU, no cluster.

lj-sandbox up [--nodes N] [--dra] [--state-dir DIR] [--no-demo] [--exit-after-demo]
    start the bed (control plane + KWOK, N Lingjun nodes each with a Runtime simulator,
    kubelet shim, Device Plugin and Exporter, plus the Scheduler Framework and the
    Controller), run the demo, print the placement table and metrics, stay up until Ctrl-C;
    --dra: the nodes in DRA mode (lj-dra-plugin, the demo's pods ask by ResourceClaim);
    with --exit-after-demo the exit status is 1 when the ledgers disagree
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

from kubernetes import client as k8s_client

from lj_runtimekit.envtest import ControlPlaneError, ToolsMissingError
from lj_runtimekit.sandbox import dra, workload
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


def run_demo(bed: Sandbox) -> list[str]:
    """Enable the nodes by label, submit the workload (by ResourceClaims on a DRA bed),
    print where it landed; where the ledgers disagree (empty when they agree)."""
    with bed.api_client() as api:
        _enable_nodes(bed, api)
        if bed.config.dra:
            return _run_dra_demo(bed, api)
        return _run_device_plugin_demo(bed, api)


def _enable_nodes(bed: Sandbox, api: k8s_client.ApiClient) -> None:
    protocol = bed.protocol
    names = [n.name for n in bed.nodes]
    with bed.step(
        f"label {len(names)} nodes {protocol.labels.enable}=true; enable Jobs run"
        " the Job Agent against each node's Runtime and are cleaned",
        bed.log_dir / "controller.log",
    ):
        workload.label_nodes(api, names, protocol.labels.enable, "true")
        workload.wait_feature_state(api, names, "enabled")
        for node, (enabled, by) in workload.runtime_feature_states(bed.nodes).items():
            _say(f"  {node}: Runtime features {'on' if enabled else 'OFF'} (set by {by})")


def _run_device_plugin_demo(bed: Sandbox, api: k8s_client.ApiClient) -> list[str]:
    protocol = bed.protocol
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
    with bed.step("read placements (scheduler annotation, Device Plugin record, Runtime, kubelet)"):
        runtime = workload.runtime_allocations(bed.nodes)
        merged = {uid: c for per_node in runtime.values() for uid, c in per_node.items()}
        kubelet = workload.kubelet_records(bed.nodes, protocol)
        rows = workload.placements(listed, protocol, merged, kubelet)
        table = workload.placement_table(rows, workload.node_device_index(api, protocol))
        problems = workload.invariant_violations(rows, runtime, protocol)
    print("\n" + table + "\n", flush=True)
    _say_ledgers("scheduler, Device Plugin, Runtime, the kubelet's PodResources", problems)
    gang = [r for r in rows if r.name.startswith("train-")]
    placed = sum(1 for r in gang if r.phase == "Running")
    _say(
        f"gang 'train': {placed}/{len(gang)} members Running"
        + (" (all or nothing)" if placed in (0, len(gang)) else " (PARTIAL gang)")
    )
    with bed.step("scrape each node's exporter for the pods' metrics"):
        _print_metrics(bed, [(r.namespace, r.name, r.node) for r in rows if r.phase == "Running"])
    return problems


def _run_dra_demo(bed: Sandbox, api: k8s_client.ApiClient) -> list[str]:
    templates, pods = dra.demo_workload(bed.protocol, bed.nodes, DEMO_NAMESPACE)
    with bed.step(
        f"submit {len(pods)} pods with ResourceClaimTemplates (TDM slices, a whole GPU,"
        " a MIG instance, a PPU); kube-scheduler allocates the claims",
        bed.state_dir / "cp" / "logs",
    ):
        workload.ensure_namespace(api, DEMO_NAMESPACE)
        dra.create_templates(api, templates)
        workload.create_pods(api, DEMO_NAMESPACE, pods)
        workload.wait_pods(
            api, DEMO_NAMESPACE, [p["metadata"]["name"] for p in pods], timeout_s=120
        )
    with bed.step("read placements (claims' allocations, Runtime, kubelet)"):
        rows, problems = dra.observe(bed, api, DEMO_NAMESPACE)
    print("\n" + dra.placement_table(rows) + "\n", flush=True)
    _say_ledgers("claims' allocations, Runtime, the kubelet's PodResources", problems)
    with bed.step("scrape each node's exporter for the pods' metrics"):
        _print_metrics(bed, [(r.namespace, r.name, r.node) for r in rows if r.phase == "Running"])
    return problems


def _say_ledgers(which: str, problems: Sequence[str]) -> None:
    _say(
        f"ledgers agree for every pod ({which})"
        if not problems
        else "LEDGER MISMATCH:\n  " + "\n  ".join(problems)
    )


def _print_metrics(bed: Sandbox, running: Sequence[tuple[str, str, str]]) -> None:
    """A few series of each running pod, (namespace, name, node), from its node's Exporter."""
    nodes = workload.sandbox_nodes_by_name(bed)
    running = [r for r in running if r[2] in nodes]

    def all_seen() -> dict[str, list[str]] | NotYet:
        texts = {n: workload.scrape(nodes[n].metrics_url) for n in {node for *_, node in running}}
        lines = {
            name: workload.pod_metric_lines(texts[node], ns, name) for ns, name, node in running
        }
        missing = [name for name, found in lines.items() if not found]
        return lines if not missing else NotYet(f"no series yet for {missing}")

    lines = wait_for(all_seen, 30, "per-pod series on the exporters")
    for _, name, node in running:
        print(f"  {name} ({nodes[node].metrics_url}):")
        for line in lines[name][:3]:
            print(f"    {line}")
    print(flush=True)


def _instructions(bed: Sandbox) -> None:
    print(f"""
The sandbox is up (state and logs in {bed.state_dir}).

  export KUBECONFIG={bed.kubeconfig}
  $(uv run lj-envtest tools)/kubectl get nodes -L {bed.protocol.labels.device_kind}
  $(uv run lj-envtest tools)/kubectl -n {DEMO_NAMESPACE} get pods -o wide
""")
    if bed.config.dra:
        print(
            "  $(uv run lj-envtest tools)/kubectl get resourceslices\n"
            f"  $(uv run lj-envtest tools)/kubectl -n {DEMO_NAMESPACE} get resourceclaims\n"
        )
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
    config = SandboxConfig(
        nodes=args.nodes, state_dir=args.state_dir, keep_state=True, dra=args.dra
    )
    bed = Sandbox(config, progress=_say)
    mode = " in DRA mode" if args.dra else ""
    _say(f"starting {args.nodes} Lingjun nodes{mode} under {args.state_dir}")
    try:
        bed.start()
        _say(f"bed up in {bed.started_s:.1f}s")
        problems: list[str] = []
        if not args.no_demo:
            problems = run_demo(bed)
            _say(f"placement table reached {time.time() - t0:.1f}s after start")
        if args.exit_after_demo:
            bed.stop(failed=bool(problems))
            return 1 if problems else 0
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
    u.add_argument(
        "--dra",
        action="store_true",
        help="DRA nodes (label lingjun.com/device-api=dra, lj-dra-plugin, the DeviceClasses,"
        " the DRA feature gates); the demo's pods ask by ResourceClaimTemplate",
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
