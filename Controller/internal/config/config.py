"""The Controller's settings, validated once at start-up (errors name the flag)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SELECTOR_TERM = re.compile(r"^!?[A-Za-z0-9./_-]+((==?|!=)[A-Za-z0-9._-]*)?$")

DEFAULT_LABEL_KEY = "lj_runtimekit_enable"
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_SOCKET_DIR = "/run/amp/eKitC/xdm/sockets/"


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag."""


def check_label_key(key: str, what: str) -> str:
    """Validate a label key (`[prefix/]name`) and return it."""
    prefix, _, name = key.rpartition("/")
    if not name or not _LABEL_NAME.match(name):
        raise ConfigError(
            f"{what}: {key!r} is not a label key (name part: 1-63 alphanumerics, '-', '_', '.')"
        )
    if prefix and not _DNS_SUBDOMAIN.match(prefix):
        raise ConfigError(f"{what}: the prefix of {key!r} is not a DNS subdomain")
    return key


def check_selector(selector: str, what: str) -> str:
    """Validate an equality-based label selector (`a=b,c,!d`) and return it."""
    if not selector:
        return ""
    for term in selector.split(","):
        if not _SELECTOR_TERM.match(term.strip()):
            raise ConfigError(
                f"{what}: {term!r} is not a label selector term (key, !key, key=value, key!=value)"
            )
    return ",".join(t.strip() for t in selector.split(","))


@dataclass(frozen=True)
class JobSettings:
    """How the enable/disable Jobs look."""

    image: str
    namespace: str = DEFAULT_NAMESPACE
    socket_dir: str = DEFAULT_SOCKET_DIR
    service_account: str = "lj-runtimekit-job-agent"
    image_pull_policy: str = "IfNotPresent"
    backoff_limit: int = 2
    active_deadline_s: int = 300
    agent_retry_timeout_s: int = 60
    run_as_user: int = 0
    run_as_group: int = 0
    priority_class: str = ""
    pod_annotations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.image.strip():
            raise ConfigError("--job-image is required: the image of lj-job-agent")
        if not DNS_LABEL.match(self.namespace):
            raise ConfigError(f"--namespace: {self.namespace!r} is not a namespace name")
        if not self.socket_dir.startswith("/"):
            raise ConfigError(f"--socket-dir: {self.socket_dir!r} must be an absolute path")
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise ConfigError(
                f"--job-image-pull-policy: {self.image_pull_policy!r} is not one of"
                " Always, IfNotPresent, Never"
            )
        if not 0 <= self.backoff_limit <= 10:
            raise ConfigError(f"--job-backoff-limit: must be 0..10, got {self.backoff_limit}")
        if not 10 <= self.active_deadline_s <= 86400:
            raise ConfigError(
                f"--job-active-deadline: must be 10..86400 seconds, got {self.active_deadline_s}"
            )
        if not 1 <= self.agent_retry_timeout_s < self.active_deadline_s:
            raise ConfigError(
                "--agent-retry-timeout: must be >= 1 and below --job-active-deadline, got"
                f" {self.agent_retry_timeout_s}"
            )
        if self.run_as_user < 0 or self.run_as_group < 0:
            raise ConfigError("--job-run-as-user/--job-run-as-group: must be >= 0")
        if not DNS_LABEL.match(self.service_account.replace(".", "-")):
            raise ConfigError(
                f"--job-service-account: {self.service_account!r} is not a service account name"
            )
        for key in self.pod_annotations:
            check_label_key(key, "--job-pod-annotation")


@dataclass(frozen=True)
class RetryPolicy:
    """Automatic retries after a retryable failure: `base_s` doubling per attempt, at most
    `max_delay_s` apart, `limit` failed Jobs in a row at most (0 = never retry)."""

    base_s: float = 10.0
    max_delay_s: float = 300.0
    limit: int = 5

    def delay_s(self, attempts: int) -> float | None:
        """Wait before the next Job after `attempts` failed ones; None at the cap."""
        if attempts >= self.limit:
            return None
        return float(min(self.max_delay_s, self.base_s * 2 ** (attempts - 1)))

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_delay_s:
            raise ConfigError("--retry-base: must be > 0 and at most --retry-max-delay")
        if not 0 <= self.limit <= 100:
            raise ConfigError(f"--retry-limit: must be 0..100, got {self.limit}")


@dataclass(frozen=True)
class ControllerSettings:
    """What the Controller watches and how it reconciles."""

    job: JobSettings
    label_key: str = DEFAULT_LABEL_KEY
    node_selector: str = ""
    workers: int = 32
    resync_period_s: float = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        check_label_key(self.label_key, "--label-key")
        check_selector(self.node_selector, "--node-selector")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"--workers: must be 1..256, got {self.workers}")
        if self.resync_period_s < 10:
            raise ConfigError(f"--resync-period: must be >= 10 seconds, got {self.resync_period_s}")

    @property
    def node_watch_selector(self) -> str:
        """Server-side selector of the node watch: the enable label (and --node-selector)."""
        return ",".join(s for s in (self.label_key, self.node_selector) if s)
