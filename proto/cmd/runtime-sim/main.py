"""lj-runtime-sim: serve a simulated Lingjun Runtime from a YAML node description."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from lj_runtimekit.proto.internal.simulator.node import NodeFileError, load_node_file
from lj_runtimekit.proto.internal.simulator.server import Simulator, SimulatorError, run
from lj_runtimekit.proto.pkg.version import InvalidVersionError, parse_version

log = logging.getLogger("lj-runtime-sim")


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="lj-runtime-sim",
        description="Serve the Lingjun Runtime contract (lingjun.runtime.v1) from a node "
        "description, on <socket-dir>/runtime.sock, with a fault-injection admin "
        "interface on <socket-dir>/sim-admin.sock.",
    )
    parser.add_argument(
        "--node",
        default=env("LJ_RUNTIME_SIM_NODE"),
        help="node description YAML file (env LJ_RUNTIME_SIM_NODE)",
    )
    parser.add_argument(
        "--socket-dir",
        default=env("LJ_RUNTIME_SIM_SOCKET_DIR"),
        help="directory of the sockets (env LJ_RUNTIME_SIM_SOCKET_DIR)",
    )
    parser.add_argument(
        "--version",
        "--runtime-version",
        dest="version",
        default=env("LJ_RUNTIME_SIM_VERSION"),
        help="Runtime version to report instead of the node file's (env LJ_RUNTIME_SIM_VERSION)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=env("LJ_RUNTIME_SIM_SEED"),
        help="metrics and fault seed instead of the node file's (env LJ_RUNTIME_SIM_SEED)",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=2.0,
        help="seconds open RPCs get to finish on shutdown (default 2)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default=env("LJ_RUNTIME_SIM_LOG_LEVEL", "INFO").upper(),
        help="log level (env LJ_RUNTIME_SIM_LOG_LEVEL, default INFO)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator until SIGTERM or SIGINT; 1 on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.node or not args.socket_dir:
        parser.error("--node and --socket-dir are required")
    try:
        version = str(parse_version(args.version, what="--version")) if args.version else None
    except InvalidVersionError as exc:
        print(f"lj-runtime-sim: error: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        node = load_node_file(Path(args.node))
        simulator = Simulator(node, Path(args.socket_dir), version, args.seed)
        asyncio.run(_serve(simulator, args.grace_period))
    except (NodeFileError, SimulatorError) as exc:
        print(f"lj-runtime-sim: error: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(simulator: Simulator, grace: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await run(simulator, stop, grace)
    log.info("simulator exiting")


if __name__ == "__main__":
    sys.exit(main())
