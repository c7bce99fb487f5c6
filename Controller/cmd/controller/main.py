"""lj-controller: node label `lj_runtimekit_enable=true` -> a Job enabling the Runtime Kit
features on that node; label removed -> a Job disabling them.

Composition root only: flags (each mirrored by an LJ_CONTROLLER_* environment
variable), validation, Kubernetes credentials, a preflight API check, signals.
Every operator mistake logs one line and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from lj_runtimekit.controller.internal.config.config import (
    DEFAULT_LABEL_KEY,
    DEFAULT_NAMESPACE,
    DEFAULT_SOCKET_DIR,
    ConfigError,
    ControllerSettings,
    JobSettings,
    RetryPolicy,
)
from lj_runtimekit.controller.internal.health.server import HealthServer
from lj_runtimekit.controller.internal.kube.client import Kube
from lj_runtimekit.controller.internal.memory.arenas import cap_malloc_arenas
from lj_runtimekit.controller.internal.operator.operator import Controller, WatchSettings
from lj_runtimekit.proto.pkg import logs
from lj_runtimekit.proto.pkg.flags import FlagParser, boolean
from lj_runtimekit.proto.pkg.kube import KubeClient, KubeConfigError, KubeError, load_access
from lj_runtimekit.proto.pkg.leaderelection import LeaseConfig
from lj_runtimekit.proto.pkg.version import component_version

DIST = "lj-runtimekit-controller"
ENV = "LJ_CONTROLLER_"
_log = logging.getLogger("lj-controller")


def _parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="lj-controller",
        description="Runs an enable Job on every node labelled <label-key>=true and a disable "
        "Job on nodes whose label went away. Every flag has an environment variable "
        f"{ENV}<FLAG> (upper case, '-' -> '_').",
    )

    def add(flag: str, default: Any, help_: str, **kw: Any) -> None:
        p.env_flag(flag, ENV + flag.lstrip("-").upper().replace("-", "_"), default, help_, **kw)

    add("--job-image", None, "image of lj-job-agent run by the Jobs (required)")
    add("--namespace", DEFAULT_NAMESPACE, "namespace of the Jobs, events and the Lease")
    add("--label-key", DEFAULT_LABEL_KEY, "node label whose value 'true' enables the features")
    add("--node-selector", "", "only manage nodes matching this label selector (a=b,c,!d)")
    add("--socket-dir", DEFAULT_SOCKET_DIR, "host directory of the Runtime sockets")
    add("--job-service-account", "lj-runtimekit-job-agent", "service account of the Job pods")
    add("--job-image-pull-policy", "IfNotPresent", "imagePullPolicy of the Job pods")
    add("--job-backoff-limit", 2, "backoffLimit of the Jobs (0..10)", type=int)
    add("--job-active-deadline", 300, "activeDeadlineSeconds of the Jobs", type=int)
    add("--agent-retry-timeout", 60, "seconds the agent retries an absent Runtime", type=int)
    add("--job-run-as-user", 0, "uid of the agent (non-root needs socket access)", type=int)
    add("--job-run-as-group", 0, "gid of the agent", type=int)
    add("--job-priority-class", "", "priorityClassName of the Job pods")
    add(
        "--job-pod-annotations",
        "",
        "extra annotations of the Job pods, comma-separated key=value",
    )
    add("--retry-base", 10.0, "seconds before the first retry of a failed Job", type=float)
    add("--retry-max-delay", 300.0, "longest wait between retries of a failed Job", type=float)
    add("--retry-limit", 5, "failed Jobs in a row before retries stop (0 = none)", type=int)
    add("--leader-elect", True, "elect a leader through a Lease", type=boolean)
    add("--lease-name", "lj-runtimekit-controller", "name of the leader election Lease")
    add("--lease-duration", 15.0, "Lease duration seconds", type=float)
    add("--lease-renew-deadline", 10.0, "seconds the leader may fail to renew", type=float)
    add("--lease-retry-period", 2.0, "seconds between Lease attempts", type=float)
    add("--workers", 32, "concurrent node reconciles", type=int)
    add(
        "--resync-period",
        300.0,
        "seconds between checks of every managed node for label/state disagreement",
        type=float,
    )
    add("--watch-server-timeout", 300.0, "seconds one watch request lasts", type=float)
    add("--watch-client-timeout", 330.0, "client-side cap of one watch request", type=float)
    add(
        "--watch-inactivity-timeout",
        70.0,
        "seconds without any event or bookmark after which a watch is reopened",
        type=float,
    )
    add(
        "--watch-stall-timeout",
        900.0,
        "seconds the resync may keep finding work without any watch event before /healthz fails",
        type=float,
    )
    add("--api-timeout", 30.0, "seconds one API request may take", type=float)
    add("--health-port", 8080, "port of /healthz and /readyz (0 = off)", type=int)
    p.env_flag(
        "--kubeconfig",
        (f"{ENV}KUBECONFIG", "KUBECONFIG"),
        "",
        "kubeconfig file ('' = in-cluster)",
        shown="in-cluster",
    )
    p.log_flags(ENV)
    p.add_argument(
        "--version", action="version", version=f"lj-controller {component_version(DIST)}"
    )
    return p


def _annotations(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--job-pod-annotations: {item!r} is not key=value")
        out[key] = value
    return out


def settings_from(args: argparse.Namespace) -> ControllerSettings:
    """Validated settings; ConfigError names the flag."""
    if args.job_image is None:
        raise ConfigError("--job-image is required: the image of lj-job-agent")
    for flag in ("lease_duration", "lease_renew_deadline", "lease_retry_period"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be > 0")
    if not args.lease_retry_period < args.lease_renew_deadline < args.lease_duration:
        raise ConfigError(
            "--lease-retry-period < --lease-renew-deadline < --lease-duration must hold"
        )
    if not 0 <= args.health_port <= 65535:
        raise ConfigError(f"--health-port: {args.health_port} is not a port (0 = off)")
    for flag in (
        "api_timeout",
        "watch_server_timeout",
        "watch_client_timeout",
        "watch_inactivity_timeout",
        "watch_stall_timeout",
    ):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be > 0")
    return ControllerSettings(
        job=JobSettings(
            image=args.job_image,
            namespace=args.namespace,
            socket_dir=args.socket_dir,
            service_account=args.job_service_account,
            image_pull_policy=args.job_image_pull_policy,
            backoff_limit=args.job_backoff_limit,
            active_deadline_s=args.job_active_deadline,
            agent_retry_timeout_s=args.agent_retry_timeout,
            run_as_user=args.job_run_as_user,
            run_as_group=args.job_run_as_group,
            priority_class=args.job_priority_class,
            pod_annotations=_annotations(args.job_pod_annotations),
        ),
        label_key=args.label_key,
        node_selector=args.node_selector,
        workers=args.workers,
        resync_period_s=args.resync_period,
        retry=RetryPolicy(args.retry_base, args.retry_max_delay, args.retry_limit),
    )


async def preflight(kube: Kube, settings: ControllerSettings) -> None:
    """Fail early and clearly when the API is unreachable or permissions are missing."""
    await kube.request(
        "list nodes (needs RBAC list on nodes)", "GET", "/api/v1/nodes", query={"limit": 1}
    )
    await kube.request(
        f"list jobs in {settings.job.namespace} (needs RBAC list on batch/jobs)",
        "GET",
        f"/apis/batch/v1/namespaces/{settings.job.namespace}/jobs",
        query={"limit": 1},
    )


async def _run(args: argparse.Namespace, settings: ControllerSettings) -> int:
    threads = settings.workers + 4
    client = KubeClient.connect(args.kubeconfig, pool_size=threads)
    kube = Kube(client, threads=threads, request_timeout_s=args.api_timeout)
    try:
        await preflight(kube, settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        lease = (
            LeaseConfig(
                namespace=settings.job.namespace,
                name=args.lease_name,
                lease_duration_s=args.lease_duration,
                renew_deadline_s=args.lease_renew_deadline,
                retry_period_s=args.lease_retry_period,
            )
            if args.leader_elect
            else None
        )
        controller = Controller(
            settings,
            kube,
            lambda: load_access(args.kubeconfig),  # re-read on each login: tokens rotate
            WatchSettings(
                server_timeout_s=args.watch_server_timeout,
                client_timeout_s=args.watch_client_timeout,
                inactivity_timeout_s=args.watch_inactivity_timeout,
                stall_timeout_s=args.watch_stall_timeout,
            ),
            lease,
            HealthServer("0.0.0.0", args.health_port) if args.health_port else None,
        )
        return await controller.run(stop)
    finally:
        kube.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Controller; 1 on a bad flag, unreachable API or lost leadership."""
    args = _parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except ConfigError as exc:
        print(f"lj-controller: error: {exc}", file=sys.stderr)
        return 1
    logs.setup(args.log_level, args.log_format)
    cap_malloc_arenas()
    try:
        return asyncio.run(_run(args, settings))
    except KubeConfigError as exc:
        _log.error("no Kubernetes credentials", extra={"error": str(exc)})
    except KubeError as exc:
        _log.error("Kubernetes API check failed", extra={"error": str(exc)})
    except KeyboardInterrupt:
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
