"""The Job Agent: one idempotent EnableFeatures/DisableFeatures call on the node's Runtime.

The agent runs once per Job on the node whose features it switches. It checks
the Runtime version first (the Runtime Kit needs Runtime >= 1.13.0), then
calls the RPC (the Controller's `NodeFeatureService`, `pkg/featureclient`)
through the shared RuntimeClient, whose tenacity retries bound how long an
absent Runtime is waited for. Every outcome is one line for the Job's
termination message and a documented exit code. The read-only `state` action
(GetFeatureState) is for operators: it switches nothing.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lj_runtimekit.controller.pkg.configpb.config_service_pb2 import FeatureState
from lj_runtimekit.controller.pkg.featureclient import (
    disable_features,
    enable_features,
    feature_state,
)
from lj_runtimekit.proto.pkg.featuregate import RuntimeTooOldError, evaluate
from lj_runtimekit.proto.pkg.runtimeclient import (
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.version import InvalidVersionError, parse_version

Action = Literal["enable", "disable", "state"]
ACTIONS: tuple[Action, ...] = ("enable", "disable", "state")
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
    """Outcome of one run: exit code, the one-line termination message and, for `state`,
    the feature state the Runtime reported."""

    code: ExitCode
    message: str
    state: FeatureState | None = None


async def run(config: AgentConfig) -> AgentResult:
    """Check the Runtime version, then switch the features as asked (idempotent), or
    read them (`state`)."""
    client = RuntimeClient(config.socket_dir, config.socket_name, retry=config.retry)
    try:
        info = await client.runtime_info()
        version = parse_version(info.version, what="Runtime version")
        evaluate(version).require_base()
        if config.action == "enable":
            state = await enable_features(client, config.requester)
        elif config.action == "disable":
            state = await disable_features(client, config.requester)
        else:
            state = await feature_state(client)
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
    node = info.node_name or "?"
    if config.action == "state":
        word = "enabled" if state.enabled else "disabled"
        return AgentResult(
            ExitCode.OK,
            f"state ok: features {word} on node {node} (Runtime {version},"
            f" last changed by {state.changed_by or '-'})",
            state,
        )
    wanted = config.action == "enable"
    if state.enabled != wanted:
        return AgentResult(
            ExitCode.RUNTIME_REFUSED,
            f"{config.action} failed: Runtime {version} on node {node} answered"
            f" but reports features {'on' if state.enabled else 'off'}",
        )
    how = "switched" if state.changed else "already"
    word = "enabled" if wanted else "disabled"
    return AgentResult(
        ExitCode.OK,
        f"{config.action} ok: features {how} {word} on node {node}"
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
