"""lj-runtime-sim: serve a simulated Lingjun Runtime from a YAML node description."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from lj_runtimekit.proto.pkg.flags import FlagParser
from lj_runtimekit.proto.pkg.version import InvalidVersionError, parse_version
from lj_runtimekit.runtimesim.node import NodeFileError, load_node_file
from lj_runtimekit.runtimesim.server import Simulator, SimulatorError, run

log = logging.getLogger("lj-runtime-sim")


def _parser() -> FlagParser:
    parser = FlagParser(
        prog="lj-runtime-sim",
        description="Serve the Lingjun Runtime contract (lingjun.runtime.v1) from a node "
        "description, on <socket-dir>/runtime.sock, with a fault-injection admin "
        "interface on <socket-dir>/sim-admin.sock.",
    )
    parser.env_flag("--node", "LJ_RUNTIME_SIM_NODE", None, "node description YAML file (required)")
    parser.env_flag(
        "--socket-dir", "LJ_RUNTIME_SIM_SOCKET_DIR", None, "directory of the sockets (required)"
    )
    parser.env_flag(
        "--version",
        "LJ_RUNTIME_SIM_VERSION",
        None,
        "Runtime version to report",
        shown="the node file's",
        dest="version",
    )
    parser.env_flag(
        "--seed",
        "LJ_RUNTIME_SIM_SEED",
        None,
        "metrics and fault seed",
        shown="the node file's",
        type=int,
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=2.0,
        help="seconds open RPCs get to finish on shutdown (default 2)",
    )
    parser.log_flags("LJ_RUNTIME_SIM_", fmt=False)
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
