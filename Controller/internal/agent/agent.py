"""The Job Agent: one idempotent EnableFeatures/DisableFeatures call on the node's Runtime.

The agent runs once per Job on the node whose features it switches. It checks
the Runtime version first (the Runtime Kit needs Runtime >= 1.13.0), then
calls the RPC through the shared RuntimeClient, whose tenacity retries bound
how long an absent Runtime is waited for. Every outcome is one line for the
Job's termination message and a documented exit code.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lj_runtimekit.proto.pkg.featuregate import RuntimeTooOldError, evaluate
from lj_runtimekit.proto.pkg.runtimeclient import (
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.version import InvalidVersionError, parse_version

Action = Literal["enable", "disable"]
ACTIONS: tuple[Action, ...] = ("enable", "disable")
TERMINATION_MESSAGE_LIMIT = 4096
"""The kubelet keeps at most 4096 bytes of a termination message."""

_log = logging.getLogger(__name__)


class ExitCode(enum.IntEnum):
    """Exit codes of lj-job-agent (documented in the Controller README)."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    RUNTIME_UNREACHABLE = 3
    RUNTIME_TOO_OLD = 4
    RUNTIME_REFUSED = 5


@dataclass(frozen=True)
class AgentConfig:
    """What the agent does and where the Runtime is."""

    action: Action
    socket_dir: str
    socket_name: str
    requester: str
    retry: RetryPolicy


@dataclass(frozen=True)
class AgentResult:
    """Outcome of one run: exit code and the one-line termination message."""

    code: ExitCode
    message: str


async def run(config: AgentConfig) -> AgentResult:
    """Check the Runtime version, then switch the features as asked (idempotent)."""
    client = RuntimeClient(config.socket_dir, config.socket_name, retry=config.retry)
    try:
        info = await client.runtime_info()
        version = parse_version(info.version, what="Runtime version")
        evaluate(version).require_base()
        if config.action == "enable":
            state = await client.enable_features(config.requester)
        else:
            state = await client.disable_features(config.requester)
    except RuntimeUnavailableError as exc:
        return AgentResult(ExitCode.RUNTIME_UNREACHABLE, f"{config.action} failed: {exc}")
    except RuntimeTooOldError as exc:
        return AgentResult(ExitCode.RUNTIME_TOO_OLD, f"{config.action} refused: {exc}")
    except RuntimeCallError as exc:
        return AgentResult(ExitCode.RUNTIME_REFUSED, f"{config.action} failed: {exc}")
    except InvalidVersionError as exc:
        return AgentResult(
            ExitCode.RUNTIME_REFUSED, f"{config.action} failed: the Runtime answered {exc}"
        )
    finally:
        await client.close()
    wanted = config.action == "enable"
    if state.enabled != wanted:
        return AgentResult(
            ExitCode.RUNTIME_REFUSED,
            f"{config.action} failed: Runtime {version} on node {info.node_name or '?'} answered"
            f" but reports features {'on' if state.enabled else 'off'}",
        )
    how = "switched" if state.changed else "already"
    word = "enabled" if wanted else "disabled"
    return AgentResult(
        ExitCode.OK,
        f"{config.action} ok: features {how} {word} on node {info.node_name or '?'}"
        f" (Runtime {version}, requester {config.requester})",
    )


def one_line(message: str) -> str:
    """The message as one line within the kubelet's termination message limit."""
    line = " ".join(message.split())
    encoded = line.encode()
    if len(encoded) <= TERMINATION_MESSAGE_LIMIT:
        return line
    return encoded[: TERMINATION_MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."


def write_termination_message(path: Path, message: str) -> None:
    """Write the one-line result where the kubelet reads the termination message.

    A file that cannot be written (e.g. running outside a pod) is logged, never fatal:
    the exit code still tells the outcome.
    """
    try:
        path.write_text(one_line(message) + "\n")
    except OSError as exc:
        _log.warning(
            "cannot write the termination message",
            extra={"path": str(path), "error": str(exc)},
        )
