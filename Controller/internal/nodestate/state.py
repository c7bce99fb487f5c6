"""The per-node feature state machine, kept on the Node so that a restart resumes.

    (none) --label true--> enabling --Job ok--> enabled
    enabled --label not true--> disabling --Job ok--> disabled
    enabling/disabling --Job failed--> failed

`failed` remembers which action failed. After a retryable failure (the Job ran
out of pod retries or time, e.g. the agent found no Runtime) the action is
retried with exponential backoff up to a cap; after a permanent one (the Job
failed through its pod failure policy) and at the cap it stays failed until the
wish changes or is re-applied (label flips) or the failed Job is deleted by hand.

On the Node:
- annotations `lj-runtimekit.io/feature-state`, `-action`, `-job`, `-since`,
  `-message` (state, action of the current Job, its namespace/name, RFC 3339
  time of the transition, last result), `-attempts` (failed Jobs of this action in
  a row) and `-retry-at` (RFC 3339 time of the next automatic retry): the backoff
  survives a restart;
- label `lj-runtimekit.io/feature-state` (same value) so that nodes the
  Controller ever touched can be listed server-side after a restart.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Literal, cast

from lj_runtimekit.proto.pkg.kube import api_time

Action = Literal["enable", "disable"]
State = Literal["enabling", "enabled", "disabling", "disabled", "failed"]
STATES: tuple[State, ...] = ("enabling", "enabled", "disabling", "disabled", "failed")

PREFIX = "lj-runtimekit.io"
STATE_LABEL = f"{PREFIX}/feature-state"
STATE_ANNOTATION = f"{PREFIX}/feature-state"
ACTION_ANNOTATION = f"{PREFIX}/feature-action"
JOB_ANNOTATION = f"{PREFIX}/feature-job"
SINCE_ANNOTATION = f"{PREFIX}/feature-since"
MESSAGE_ANNOTATION = f"{PREFIX}/feature-message"
ATTEMPTS_ANNOTATION = f"{PREFIX}/feature-attempts"
RETRY_AT_ANNOTATION = f"{PREFIX}/feature-retry-at"
MESSAGE_LIMIT = 1024

IN_PROGRESS: dict[Action, State] = {"enable": "enabling", "disable": "disabling"}
DONE: dict[Action, State] = {"enable": "enabled", "disable": "disabled"}


@dataclass(frozen=True)
class NodeState:
    """What the node's annotations say (all None on a node never touched)."""

    state: State | None = None
    action: Action | None = None
    job: str | None = None
    since: str | None = None
    message: str | None = None
    attempts: int = 0
    retry_at: str | None = None

    @classmethod
    def from_annotations(cls, annotations: dict[str, str] | None) -> NodeState:
        """Read the state; unknown values (hand edits) read as untouched."""
        a = annotations or {}
        state = a.get(STATE_ANNOTATION)
        action = a.get(ACTION_ANNOTATION)
        attempts = a.get(ATTEMPTS_ANNOTATION) or ""
        return cls(
            state=state if state in STATES else None,
            action=cast(Action, action) if action in ("enable", "disable") else None,
            job=a.get(JOB_ANNOTATION) or None,
            since=a.get(SINCE_ANNOTATION) or None,
            message=a.get(MESSAGE_ANNOTATION) or None,
            attempts=int(attempts) if attempts.isdigit() else 0,
            retry_at=a.get(RETRY_AT_ANNOTATION) or None,
        )

    def attempts_for(self, target: Action) -> int:
        """Failed Jobs of `target` in a row so far (another action starts from zero)."""
        return self.attempts if self.action == target else 0

    def retry_in_s(self, now: datetime.datetime) -> float | None:
        """Seconds until the scheduled automatic retry (<= 0: due); None when none is."""
        if self.state != "failed" or self.retry_at is None:
            return None
        try:
            due = datetime.datetime.strptime(self.retry_at, RFC3339).replace(tzinfo=datetime.UTC)
        except ValueError:
            return 0.0  # a hand-edited time: retry now rather than never
        return (due - now).total_seconds()

    def settled_for(self, target: Action) -> bool:
        """True when nothing more needs to happen for `target` (failed waits for a new wish)."""
        if target == "enable":
            return self.state == "enabled"
        return self.state in (None, "disabled")


RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def retry_time(now: datetime.datetime, delay_s: float) -> str:
    """RFC 3339 time `delay_s` after `now`, rounded up to the next second."""
    due = now + datetime.timedelta(seconds=delay_s + 0.999)
    return due.strftime(RFC3339)


def desired_action(value: str | None, state: NodeState) -> Action | None:
    """The wish: enable when the label value is exactly `true`; otherwise disable, but only
    on a node the Controller touched (None: leave an untouched node alone)."""
    if value == "true":
        return "enable"
    if state.state is None:
        return None
    return "disable"


def label_value_is_invalid(value: str | None) -> bool:
    """A present label value that means neither `true` nor an explicit `false`."""
    return value is not None and value not in ("true", "false")


def transition(
    state: State,
    action: Action,
    job: str | None,
    message: str | None = None,
    attempts: int = 0,
    retry_at: str | None = None,
) -> dict[str, Any]:
    """Merge patch of the Node's metadata that records a transition (attempts 0 and no
    retry time remove those annotations)."""
    return {
        "metadata": {
            "labels": {STATE_LABEL: state},
            "annotations": {
                STATE_ANNOTATION: state,
                ACTION_ANNOTATION: action,
                JOB_ANNOTATION: job,
                SINCE_ANNOTATION: api_time(),
                MESSAGE_ANNOTATION: message[:MESSAGE_LIMIT] if message else None,
                ATTEMPTS_ANNOTATION: str(attempts) if attempts else None,
                RETRY_AT_ANNOTATION: retry_at,
            },
        }
    }
