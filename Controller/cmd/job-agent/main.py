"""lj-job-agent: switch the Runtime Kit features of this node on or off, once.

    lj-job-agent enable|disable [--socket-dir DIR] [--termination-log FILE]

Exit codes: 0 done (or already so), 1 internal error, 2 usage, 3 Runtime
unreachable after the bounded retries, 4 Runtime older than 1.13.0, 5 Runtime
refused the call. The one-line result goes to the termination message file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

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
    env = os.environ.get
    parser = FlagParser(
        prog="lj-job-agent",
        error_status=2,
        description="Enable or disable the Runtime Kit features of this node through the "
        "Runtime's NodeFeatureService (idempotent). Exit codes: 0 ok, 1 internal error, "
        "2 usage, 3 Runtime unreachable, 4 Runtime too old (< v1.13.0), 5 Runtime refused.",
    )
    parser.add_argument("action", choices=ACTIONS, help="what to do with the node's features")
    parser.add_argument(
        "--socket-dir",
        default=env("LJ_RUNTIME_SOCKET_DIR", DEFAULT_SOCKET_DIR),
        help=f"directory of the Runtime sockets (env LJ_RUNTIME_SOCKET_DIR, "
        f"default {DEFAULT_SOCKET_DIR})",
    )
    parser.add_argument(
        "--socket-name",
        default=env("LJ_RUNTIME_SOCKET_NAME", DEFAULT_SOCKET_NAME),
        help=f"Runtime socket file in --socket-dir (env LJ_RUNTIME_SOCKET_NAME, "
        f"default {DEFAULT_SOCKET_NAME})",
    )
    parser.add_argument(
        "--requester",
        default=env("LJ_JOB_AGENT_REQUESTER") or socket.gethostname(),
        help="who asks, for the Runtime's audit log (env LJ_JOB_AGENT_REQUESTER, "
        "default the host name, i.e. the pod name)",
    )
    parser.add_argument(
        "--retry-timeout",
        type=positive_seconds,
        default=env("LJ_JOB_AGENT_RETRY_TIMEOUT", "60"),
        metavar="SECONDS",
        help="how long an unreachable Runtime is retried (env LJ_JOB_AGENT_RETRY_TIMEOUT, "
        "default 60)",
    )
    parser.add_argument(
        "--retry-attempts",
        type=int,
        default=env("LJ_JOB_AGENT_RETRY_ATTEMPTS", "10"),
        metavar="N",
        help="at most this many attempts per call (env LJ_JOB_AGENT_RETRY_ATTEMPTS, default 10)",
    )
    parser.add_argument(
        "--call-timeout",
        type=positive_seconds,
        default=env("LJ_JOB_AGENT_CALL_TIMEOUT", "10"),
        metavar="SECONDS",
        help="deadline of one RPC (env LJ_JOB_AGENT_CALL_TIMEOUT, default 10)",
    )
    parser.add_argument(
        "--termination-log",
        type=Path,
        default=Path(env("LJ_JOB_AGENT_TERMINATION_LOG", "/dev/termination-log")),
        help="file the one-line result is written to (env LJ_JOB_AGENT_TERMINATION_LOG, "
        "default /dev/termination-log)",
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        default=env("LJ_JOB_AGENT_LOG_FORMAT", "auto"),
        help="log format (env LJ_JOB_AGENT_LOG_FORMAT, default auto: text on a TTY)",
    )
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
    write_termination_message(args.termination_log, result.message)
    return int(result.code)


if __name__ == "__main__":
    sys.exit(main())
