"""lj-job-agent: switch the Runtime Kit features of this node on or off, once.

    lj-job-agent enable|disable [--socket-dir DIR] [--termination-log FILE]
    lj-job-agent state [--socket-dir DIR]

Exit codes: 0 done (or already so), 1 internal error, 2 usage, 3 Runtime
unreachable after the bounded retries, 4 Runtime older than 1.13.0, 5 Runtime
refused the call. The one-line result of enable/disable goes to the termination
message file; `state` (read-only, for operators) prints the Runtime's feature
state as JSON instead.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import json_format

from lj_runtimekit.controller.internal.agent.agent import (
    ACTIONS,
    AgentConfig,
    AgentResult,
    ExitCode,
    run,
    write_termination_message,
)
from lj_runtimekit.proto.pkg import logs
from lj_runtimekit.proto.pkg.flags import FlagParser, positive_seconds
from lj_runtimekit.proto.pkg.runtimeclient import (
    DEFAULT_SOCKET_DIR,
    DEFAULT_SOCKET_NAME,
    RetryPolicy,
)
from lj_runtimekit.proto.pkg.version import component_version

DIST = "lj-runtimekit-controller"
_log = logging.getLogger("lj-job-agent")


def _parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog="lj-job-agent",
        error_status=2,
        description="Enable or disable the Runtime Kit features of this node through the "
        "Runtime's NodeFeatureService (idempotent), or print their state as JSON (read-only). "
        "Exit codes: 0 ok, 1 internal error, 2 usage, 3 Runtime unreachable, 4 Runtime too old "
        "(< v1.13.0), 5 Runtime refused.",
    )
    parser.add_argument(
        "action", choices=ACTIONS, help="what to do with the node's features (state: only read)"
    )
    parser.env_flag(
        "--socket-dir",
        "LJ_RUNTIME_SOCKET_DIR",
        DEFAULT_SOCKET_DIR,
        "directory of the Runtime sockets",
    )
    parser.env_flag(
        "--socket-name",
        "LJ_RUNTIME_SOCKET_NAME",
        DEFAULT_SOCKET_NAME,
        "Runtime socket file in --socket-dir",
    )
    parser.env_flag(
        "--requester",
        "LJ_JOB_AGENT_REQUESTER",
        socket.gethostname(),
        "who asks, for the Runtime's audit log",
        shown="the host name, i.e. the pod name",
    )
    parser.env_flag(
        "--retry-timeout",
        "LJ_JOB_AGENT_RETRY_TIMEOUT",
        "60",
        "how long an unreachable Runtime is retried",
        type=positive_seconds,
        metavar="SECONDS",
    )
    parser.env_flag(
        "--retry-attempts",
        "LJ_JOB_AGENT_RETRY_ATTEMPTS",
        "10",
        "at most this many attempts per call",
        type=int,
        metavar="N",
    )
    parser.env_flag(
        "--call-timeout",
        "LJ_JOB_AGENT_CALL_TIMEOUT",
        "10",
        "deadline of one RPC",
        type=positive_seconds,
        metavar="SECONDS",
    )
    parser.env_flag(
        "--termination-log",
        "LJ_JOB_AGENT_TERMINATION_LOG",
        "/dev/termination-log",
        "file the one-line result of enable/disable is written to",
        type=Path,
    )
    parser.log_flags("LJ_JOB_AGENT_", level=False)
    parser.add_argument(
        "--version", action="version", version=f"lj-job-agent {component_version(DIST)}"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent once; the exit code tells the outcome (see the module docstring)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.retry_attempts < 1:
        parser.error(f"--retry-attempts must be >= 1, got {args.retry_attempts}")
    logs.setup("INFO", args.log_format)
    config = AgentConfig(
        action=args.action,
        socket_dir=args.socket_dir,
        socket_name=args.socket_name,
        requester=args.requester,
        retry=RetryPolicy(
            attempts=args.retry_attempts,
            max_delay_s=args.retry_timeout,
            call_timeout_s=args.call_timeout,
        ),
    )
    try:
        result = asyncio.run(run(config))
    except Exception as exc:  # a bug: still leave one line for the Job's events
        _log.exception("internal error")
        result = AgentResult(ExitCode.INTERNAL, f"{args.action} failed: internal error: {exc}")
    fields = {"action": args.action, "exit_code": int(result.code), "result": result.message}
    if result.code == ExitCode.OK:
        _log.info("done", extra=fields)
    else:
        _log.error("failed", extra=fields)
    if args.action != "state":
        write_termination_message(args.termination_log, result.message)
    elif result.state is not None:
        print(json_format.MessageToJson(result.state))
    return int(result.code)


if __name__ == "__main__":
    sys.exit(main())
