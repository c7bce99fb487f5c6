"""lj-envtest: the envtest control plane for people and benchmarks.

lj-envtest cluster-up [--state-dir DIR] [--nodes N]   start in the background
lj-envtest cluster-down [--state-dir DIR]             stop it
lj-envtest bench [--out FILE]                         measure start-up and KWOK scale
lj-envtest tools                                      print the bin directory
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane, ControlPlaneConfig, ControlPlaneError
from lj_runtimekit.envtest.nodes import GpuNodeSpec, NodeFactory, gpu_node_manifest
from lj_runtimekit.envtest.versions import ToolsMissingError, bin_dir, find_tools, version_dir

DEFAULT_STATE_DIR = Path("/tmp/lj-runtimekit-cluster")


class CliError(Exception):
    """An operator mistake or a failed start: printed without a traceback."""


# -- cluster-up / cluster-down ----------------------------------------------------------------


def _daemon_pid(state_dir: Path) -> int | None:
    """PID of a live cluster daemon for `state_dir`, else None."""
    try:
        pid = int((state_dir / "daemon.pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _kubeconfig_line(state_dir: Path) -> str:
    return f"export KUBECONFIG={state_dir / 'kubeconfig'}"


def cluster_up(state_dir: Path, nodes: int, timeout_s: float) -> int:
    find_tools()
    if _daemon_pid(state_dir) is not None:
        print(f"cluster already running (state in {state_dir})")
        print(_kubeconfig_line(state_dir))
        return 0
    if state_dir.exists():
        _kill_leftovers(state_dir)
        subprocess.run(["rm", "-rf", str(state_dir)], check=True)
    state_dir.mkdir(parents=True)
    log = state_dir / "daemon.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit.envtest.cli",
                "_serve",
                f"--state-dir={state_dir}",
                f"--nodes={nodes}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    ready = state_dir / "ready"
    while not ready.exists():
        if proc.poll() is not None:
            raise CliError(
                f"the control plane did not start (status {proc.returncode}); see {log}:\n"
                + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            )
        if time.monotonic() > deadline:
            raise CliError(f"the control plane was not ready within {timeout_s:.0f}s; see {log}")
        time.sleep(0.2)
    print(f"control plane up in {ready.read_text().strip()}s (state and logs in {state_dir})")
    print(_kubeconfig_line(state_dir))
    return 0


def _kill_leftovers(state_dir: Path) -> None:
    """Kills process groups recorded by a daemon that did not clean up."""
    pids = state_dir / "component.pids"
    if not pids.exists():
        return
    for line in pids.read_text().split():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(line), signal.SIGKILL)


def cluster_down(state_dir: Path, timeout_s: float) -> int:
    pid = _daemon_pid(state_dir)
    if pid is None:
        if state_dir.exists():
            _kill_leftovers(state_dir)
            print(f"no cluster running; left state in {state_dir} as it was")
        else:
            print(f"no cluster running (no {state_dir})")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _daemon_pid(state_dir) is not None:
        if time.monotonic() > deadline:
            _kill_leftovers(state_dir)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    print(f"cluster stopped (logs kept in {state_dir / 'logs'})")
    return 0


def serve(state_dir: Path, nodes: int) -> int:
    """The background daemon: start, record, wait for SIGTERM, stop."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    (state_dir / "daemon.pid").write_text(str(os.getpid()))
    cp = ControlPlane(ControlPlaneConfig(state_dir=state_dir, keep_state=True))
    cp.start()
    (state_dir / "component.pids").write_text(
        "\n".join(str(p.pid) for p in cp.processes if p.pid is not None)
    )
    if nodes:
        with cp.api_client() as api:
            factory = NodeFactory(api)
            names = factory.create_many(GpuNodeSpec(name=f"gpu-node-{i}") for i in range(nodes))
            factory.wait_ready(names, 120)
    (state_dir / "ready").write_text(f"{cp.ready_s:.1f}")
    print(f"ready; {_kubeconfig_line(state_dir)}", flush=True)
    while not stop.wait(1.0):
        try:
            cp.check_alive()
        except ControlPlaneError as exc:
            print(f"a component died: {exc}", flush=True)
            cp.stop(failed=True)
            return 1
    cp.stop()
    (state_dir / "daemon.pid").unlink(missing_ok=True)
    (state_dir / "ready").unlink(missing_ok=True)
    return 0


# -- benchmark --------------------------------------------------------------------------------


def _cold_build_s() -> float:
    record = version_dir() / "build-record.json"
    try:
        value = json.loads(record.read_text())["cold_build_s"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError) as exc:
        raise CliError(f"no cold build record in {record} ({exc}); run `make k8s-tools`") from None
    return float(value)


def _time_nodes(cp: ControlPlane, count: int) -> float:
    with cp.api_client() as api:
        factory = NodeFactory(api, group="bench")
        specs = [GpuNodeSpec(name=f"bench-node-{i:05d}") for i in range(count)]
        began = time.monotonic()
        core = k8s_client.CoreV1Api(api)
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(
                pool.map(
                    lambda s: core.create_node(
                        gpu_node_manifest(s, group="bench"), _preload_content=False
                    ),
                    specs,
                )
            )
        factory.created = [s.name for s in specs]
        factory.wait_ready(factory.created, timeout_s=600, untainted=False)
        return time.monotonic() - began


def bench(out: Path, starts: int, nodes: int) -> int:
    results: dict[str, float] = {"cold_build_s": _cold_build_s()}
    times: list[float] = []
    for _ in range(starts):
        cp = ControlPlane(ControlPlaneConfig())
        began = time.monotonic()
        with cp:
            times.append(time.monotonic() - began)
            if len(times) == starts:
                results[f"kwok_{nodes}_nodes_s"] = round(_time_nodes(cp, nodes), 2)
    results["warm_start_s"] = round(statistics.median(times), 2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


# -- entry point ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lj-envtest", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("cluster-up", help="start the control plane + KWOK in the background")
    up.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    up.add_argument("--nodes", type=int, default=2, help="fake GPU nodes to create (default 2)")
    up.add_argument("--timeout", type=float, default=180)
    down = sub.add_parser("cluster-down", help="stop the background control plane")
    down.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    down.add_argument("--timeout", type=float, default=30)
    srv = sub.add_parser("_serve")
    srv.add_argument("--state-dir", type=Path, required=True)
    srv.add_argument("--nodes", type=int, default=0)
    b = sub.add_parser("bench", help="write start-up and KWOK scale numbers as JSON")
    b.add_argument("--out", type=Path, default=Path("bench/parts/controlplane.json"))
    b.add_argument("--starts", type=int, default=3, help="control plane starts (median)")
    b.add_argument("--nodes", type=int, default=1000)
    sub.add_parser("tools", help="print the directory of the pinned binaries")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "cluster-up":
            if args.nodes < 0:
                raise CliError("--nodes must be >= 0")
            return cluster_up(args.state_dir, args.nodes, args.timeout)
        if args.command == "cluster-down":
            return cluster_down(args.state_dir, args.timeout)
        if args.command == "_serve":
            return serve(args.state_dir, args.nodes)
        if args.command == "bench":
            if args.starts < 1 or args.nodes < 1:
                raise CliError("--starts and --nodes must be >= 1")
            return bench(args.out, args.starts, args.nodes)
        print(bin_dir())
        return 0
    except (CliError, ToolsMissingError, ControlPlaneError, ValueError) as exc:
        print(f"lj-envtest: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
