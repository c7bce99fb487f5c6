"""lj-scheduler: composition root. Flags (mirrored by LJ_SCHEDULER_* variables), wiring, signals.

Modes: `scheduler` (default) schedules the pods whose spec.schedulerName is a
profile's name; `extender` serves the kube-scheduler extender verbs instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Sequence
from types import FrameType

from lj_runtimekit.proto.pkg import logs, protocolinfo
from lj_runtimekit.proto.pkg.flags import FlagParser, port
from lj_runtimekit.proto.pkg.kube import (
    Informer,
    KubeClient,
    KubeConfigError,
    KubeError,
    RateLimiter,
)
from lj_runtimekit.proto.pkg.leaderelection import LeaderElector, LeaseConfig
from lj_runtimekit.proto.pkg.protocol import ProtocolError, load_protocol
from lj_runtimekit.proto.pkg.version import component_version
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeOwnership
from lj_runtimekit.schedulerframework.internal.config.config import (
    Config,
    ConfigError,
    load_config,
)
from lj_runtimekit.schedulerframework.internal.dra.objects import API as DRA_API
from lj_runtimekit.schedulerframework.internal.extender.server import (
    Extender,
    Security,
    read_token,
    security_problem,
    serve,
)
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling import plugin as coscheduling
from lj_runtimekit.schedulerframework.internal.scheduler import metrics
from lj_runtimekit.schedulerframework.internal.scheduler.events import EventRecorder
from lj_runtimekit.schedulerframework.internal.scheduler.httpserver import serve_http
from lj_runtimekit.schedulerframework.internal.scheduler.scheduler import Scheduler

DIST = "lj-runtimekit-schedulerframework"
log = logging.getLogger("lj-scheduler")


ENV = "LJ_SCHEDULER_"
"""Every flag is mirrored by an environment variable with this prefix (but --protocol-file:
LJ_PROTOCOL_FILE, as in every component)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = FlagParser(prog="lj-scheduler", description=__doc__)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.env_flag("--config", f"{ENV}CONFIG", None, "LjSchedulerConfiguration YAML", shown="built-in")
    p.env_flag(
        "--scheduler-name",
        f"{ENV}SCHEDULER_NAME",
        None,
        "name of the (single) profile; pods select it with spec.schedulerName",
        shown="the config's, lj-scheduler",
    )
    p.env_flag("--kubeconfig", f"{ENV}KUBECONFIG", None, "kubeconfig", shown="in-cluster")
    p.protocol_flag("protocol.yaml", old_env=(f"{ENV}PROTOCOL_FILE",))
    p.env_flag(
        "--mode",
        f"{ENV}MODE",
        "scheduler",
        "run as a scheduler, or as an HTTP extender of kube-scheduler",
        choices=("scheduler", "extender"),
    )
    p.env_flag(
        "--extender-address",
        f"{ENV}EXTENDER_ADDRESS",
        "127.0.0.1",
        "extender address (other than loopback only with TLS and an authenticated caller)",
    )
    p.env_flag("--extender-port", f"{ENV}EXTENDER_PORT", "8888", "extender port", type=port)
    p.env_flag(
        "--extender-prefix", f"{ENV}EXTENDER_PREFIX", "", "extender URL prefix", shown="none"
    )
    p.env_flag("--extender-tls-cert", f"{ENV}EXTENDER_TLS_CERT", None, "extender TLS certificate")
    p.env_flag("--extender-tls-key", f"{ENV}EXTENDER_TLS_KEY", None, "extender TLS private key")
    p.env_flag(
        "--extender-client-ca",
        f"{ENV}EXTENDER_CLIENT_CA",
        None,
        "CA bundle: extender callers must present a client certificate it signed",
    )
    p.env_flag(
        "--extender-token-file",
        f"{ENV}EXTENDER_TOKEN_FILE",
        None,
        "file holding the bearer token extender callers must send",
    )
    p.env_flag(
        "--metrics-port",
        f"{ENV}METRICS_PORT",
        "10261",
        "Prometheus /metrics port (0: off)",
        type=port,
    )
    p.env_flag(
        "--leader-elect",
        f"{ENV}LEADER_ELECT",
        None,
        "override leaderElection.leaderElect",
        shown="the config's",
        choices=("true", "false"),
    )
    p.env_flag(
        "--lease-namespace",
        f"{ENV}LEASE_NAMESPACE",
        None,
        "namespace of the leader election Lease",
        shown="the config's",
    )
    p.env_flag(
        "--identity",
        f"{ENV}IDENTITY",
        None,
        "leader election identity",
        shown="hostname_random",
    )
    p.env_flag(
        "--kube-api-qps",
        f"{ENV}KUBE_API_QPS",
        None,
        "API writes per second",
        shown="clientConnection.qps",
        type=float,
    )
    p.env_flag(
        "--kube-api-burst",
        f"{ENV}KUBE_API_BURST",
        None,
        "API write burst",
        shown="clientConnection.burst",
        type=int,
    )
    p.log_flags(ENV)
    return p.parse_args(argv)


def dra_informers(kube: KubeClient, scheduler: Scheduler, driver: str) -> list[Informer]:
    """The informers of DRA (the driver's ResourceSlices, DeviceClasses, ResourceClaims)
    where the API server serves resource.k8s.io/v1; none where it does not (before
    Kubernetes 1.34: pods with claims then stay pending, saying so)."""
    try:
        served = scheduler.get_json(DRA_API) is not None
    except KubeError as exc:
        log.warning("cannot tell whether the API server serves %s: %s", DRA_API, exc)
        served = True  # the informers retry until it answers
    if not served:
        log.info("the API server does not serve %s: ResourceClaims are not allocated", DRA_API)
        return []
    return [
        Informer(
            kube,
            f"{DRA_API}/resourceslices",
            scheduler.on_resource_slice,
            "resourceslices",
            params={"fieldSelector": f"spec.driver={driver}"},
        ),
        Informer(kube, f"{DRA_API}/deviceclasses", scheduler.on_device_class, "deviceclasses"),
        Informer(kube, f"{DRA_API}/resourceclaims", scheduler.on_resource_claim, "resourceclaims"),
    ]


def _apply_overrides(config: Config, args: argparse.Namespace) -> Config:
    """The configuration file's values, with the flags given on the command line on top."""
    le = config.leader_election
    if args.leader_elect:
        le = dataclasses.replace(le, leader_elect=args.leader_elect == "true")
    if args.lease_namespace:
        le = dataclasses.replace(le, resource_namespace=args.lease_namespace)
    return dataclasses.replace(
        config,
        qps=args.kube_api_qps or config.qps,
        burst=args.kube_api_burst or config.burst,
        leader_election=le,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.version:
        print(f"lj-scheduler {component_version(DIST)}")
        return 0
    logs.setup(args.log_level, args.log_format)
    try:
        protocol = load_protocol(args.protocol_file)
        config = _apply_overrides(load_config(args.config, args.scheduler_name), args)
    except (ProtocolError, ConfigError) as exc:
        log.error("%s", exc)
        return 1
    security = Security()
    if args.mode == "extender":
        try:
            token = read_token(args.extender_token_file) if args.extender_token_file else None
        except ValueError as exc:
            log.error("%s", exc)
            return 1
        security = Security(
            args.extender_tls_cert, args.extender_tls_key, args.extender_client_ca, token
        )
        problem = security_problem(args.extender_address, security)
        if problem is not None:
            log.error("%s", problem)
            return 1
    try:
        # One connection per binding thread, plus the watches, events and the lease.
        kube = KubeClient.connect(
            args.kubeconfig,
            pool_size=config.bind_workers + 8,
            limiter=RateLimiter(config.qps, config.burst),
        )
    except KubeConfigError as exc:
        log.error("cannot configure the Kubernetes client: %s", exc)
        return 1
    identity = args.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    names = ",".join(p.scheduler_name for p in config.profiles)
    recorder = EventRecorder(kube, names, identity)
    scheduler = Scheduler(config, protocol, kube, recorder)
    scheduler.cache.set_ownership(
        NodeOwnership(
            config.node_owner_label,
            frozenset(p.scheduler_name for p in config.profiles),
            config.require_node_owner,
        )
    )
    problem = coscheduling.job_set_problem(config, scheduler.get_json)
    if problem is not None:
        log.error("%s", problem)
        return 1

    stop = threading.Event()
    lost = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received, stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.metrics_port:
        metrics.PROTOCOL.labels(protocolinfo.protocol_sha256(protocol)).set(1)
        try:
            serve_http(args.metrics_port, scheduler)
        except OSError as exc:
            log.error("cannot serve metrics on port %d: %s", args.metrics_port, exc)
            return 1

    informers = [
        Informer(kube, "/api/v1/nodes", scheduler.on_node, "nodes"),
        Informer(kube, "/api/v1/pods", scheduler.on_pod, "pods"),
    ]
    if args.mode == "scheduler":
        informers += dra_informers(kube, scheduler, protocol.dra.driver)
    for inf in informers:
        inf.start()
    log.info(
        "starting",
        extra={
            "version": str(component_version(DIST)),
            "profiles": names,
            "mode": args.mode,
            "identity": identity,
            "lease": config.leader_election.resource_name
            if config.leader_election.leader_elect
            else "",
            "config": config.source,
        },
    )
    for inf in informers:  # the cache is rebuilt from the cluster before any decision
        while not inf.synced.wait(1.0):
            if stop.is_set():
                return 0
    log.info(
        "cache synced",
        extra={"nodes": len(scheduler.cache.nodes), "pods": len(scheduler.cache.pods)},
    )

    elector: LeaderElector | None = None
    le = config.leader_election
    if le.leader_elect:
        leader = elector = LeaderElector(
            kube,
            LeaseConfig(
                namespace=le.resource_namespace,
                name=le.resource_name,
                identity=identity,
                lease_duration_s=le.lease_duration_s,
                renew_deadline_s=le.renew_deadline_s,
                retry_period_s=le.retry_period_s,
            ),
        )
        if not leader.acquire(stop):
            return 0

        def renew() -> None:
            if leader.renew_until_lost(stop):
                lost.set()

        threading.Thread(target=renew, name="lease-renew", daemon=True).start()
    metrics.LEADER.set(1)

    server = None
    if args.mode == "extender":
        try:
            server = serve(
                Extender(scheduler),
                args.extender_address,
                args.extender_port,
                args.extender_prefix,
                security,
            )
        except ValueError as exc:  # an unusable certificate, key or CA
            log.error("%s", exc)
            return 1
        except OSError as exc:
            log.error(
                "cannot serve the extender on %s:%d: %s",
                args.extender_address,
                args.extender_port,
                exc,
            )
            return 1
        log.info(
            "extender serving",
            extra={
                "port": server.server_address[1],
                "tls": security.tls,
                "client_ca": bool(security.client_ca),
                "token": bool(security.token),
            },
        )
        while not stop.wait(0.5) and not lost.is_set():
            pass
    else:
        loop = threading.Thread(target=scheduler.run, args=(stop,), name="schedule", daemon=True)
        loop.start()
        while not stop.wait(0.5) and not lost.is_set():
            pass
        stop.set()
        scheduler.stop()  # binds not sent yet are dropped; the loop ends after its cycle
        loop.join(timeout=10)
    stop.set()
    for inf in informers:
        inf.stop()
    if server is not None:
        server.shutdown()
    scheduler.stop()
    recorder.stop()
    metrics.LEADER.set(0)
    if lost.is_set():
        log.error("leader lease lost; exiting so that a fresh replica takes over")
        return 1
    if elector is not None:
        elector.release()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
