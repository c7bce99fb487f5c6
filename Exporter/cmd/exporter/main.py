"""lj-exporter: Prometheus metrics per accelerator, MIG instance and pod of one node.

The composition root: flags (mirrored by LJ_EXPORTER_* environment variables),
the protocol file, logging, wiring, signals. Every operator mistake is one log
line and exit status 1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

from prometheus_client import disable_created_metrics

from lj_runtimekit.exporter.internal.collector.loop import CollectionLoop
from lj_runtimekit.exporter.internal.metrics.registry import ExporterMetrics
from lj_runtimekit.exporter.internal.pods.apiserver import ApiServerPods
from lj_runtimekit.exporter.internal.pods.kubelet import (
    DEFAULT_KUBELET_PODS_URL,
    KubeletPods,
    check_pods_url,
)
from lj_runtimekit.exporter.internal.pods.source import NodePods, PodLister
from lj_runtimekit.exporter.internal.server.http import MetricsServer, make_app
from lj_runtimekit.proto.pkg import logs
from lj_runtimekit.proto.pkg.flags import FlagParser, port, positive_seconds
from lj_runtimekit.proto.pkg.protocol import ProtocolError, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import (
    DEFAULT_SOCKET_DIR,
    DEFAULT_SOCKET_NAME,
    RetryPolicy,
    RuntimeClient,
)
from lj_runtimekit.proto.pkg.version import component_version

PROG = "lj-exporter"
DISTRIBUTION = "lj-runtimekit-exporter"
DEFAULT_PORT = 9445
"""Clear of dcgm-exporter (9400) and the HAMi monitor (9394)."""
DEFAULT_INTERVAL_S = 15.0

log = logging.getLogger(PROG)


def _parser() -> FlagParser:
    env = os.environ.get
    p = FlagParser(
        prog=PROG,
        description="Serve Prometheus metrics of the node's accelerators (devices, MIG"
        " instances) and of the containers using them, read from the Lingjun Runtime and"
        " the kubelet. Every flag has an LJ_EXPORTER_* environment variable.",
    )
    p.add_argument(
        "--runtime-socket-dir",
        default=env("LJ_EXPORTER_RUNTIME_SOCKET_DIR", DEFAULT_SOCKET_DIR),
        help=f"directory of the Runtime sockets (env LJ_EXPORTER_RUNTIME_SOCKET_DIR,"
        f" default {DEFAULT_SOCKET_DIR})",
    )
    p.add_argument(
        "--runtime-socket-name",
        default=env("LJ_EXPORTER_RUNTIME_SOCKET_NAME", DEFAULT_SOCKET_NAME),
        help=f"Runtime socket file name (env LJ_EXPORTER_RUNTIME_SOCKET_NAME,"
        f" default {DEFAULT_SOCKET_NAME})",
    )
    p.add_argument(
        "--runtime-timeout",
        type=positive_seconds,
        default=env("LJ_EXPORTER_RUNTIME_TIMEOUT", "5"),
        help="seconds one Runtime call may take (env LJ_EXPORTER_RUNTIME_TIMEOUT, default 5)",
    )
    p.add_argument(
        "--kubelet-pods-url",
        default=env("LJ_EXPORTER_KUBELET_PODS_URL", DEFAULT_KUBELET_PODS_URL),
        help="the kubelet read-only /pods endpoint (env LJ_EXPORTER_KUBELET_PODS_URL,"
        f" default {DEFAULT_KUBELET_PODS_URL})",
    )
    p.add_argument(
        "--kubelet-timeout",
        type=positive_seconds,
        default=env("LJ_EXPORTER_KUBELET_TIMEOUT", "5"),
        help="seconds a /pods request may take (env LJ_EXPORTER_KUBELET_TIMEOUT, default 5)",
    )
    p.add_argument(
        "--apiserver-fallback",
        choices=("auto", "off"),
        default=env("LJ_EXPORTER_APISERVER_FALLBACK", "auto"),
        help="read the node's pods from the API server (by spec.nodeName) while the kubelet"
        " does not answer: auto = when running in a cluster or --kubeconfig is given"
        " (env LJ_EXPORTER_APISERVER_FALLBACK, default auto)",
    )
    p.add_argument(
        "--kubeconfig",
        default=env("LJ_EXPORTER_KUBECONFIG") or env("KUBECONFIG"),
        help="kubeconfig for the API server fallback (env LJ_EXPORTER_KUBECONFIG or"
        " KUBECONFIG; default: in-cluster config)",
    )
    p.add_argument(
        "--node-name",
        default=env("LJ_EXPORTER_NODE_NAME") or env("NODE_NAME") or socket.gethostname(),
        help="this node's name: the `node` label and the fallback's field selector"
        " (env LJ_EXPORTER_NODE_NAME or NODE_NAME, default the host name)",
    )
    p.add_argument(
        "--collection-interval",
        type=positive_seconds,
        default=env("LJ_EXPORTER_COLLECTION_INTERVAL", str(DEFAULT_INTERVAL_S)),
        help="seconds between background collections (env LJ_EXPORTER_COLLECTION_INTERVAL,"
        f" default {DEFAULT_INTERVAL_S:g})",
    )
    p.add_argument(
        "--listen-address",
        default=env("LJ_EXPORTER_LISTEN_ADDRESS", "0.0.0.0"),
        help="address of the HTTP server, `::` for IPv6 (env LJ_EXPORTER_LISTEN_ADDRESS,"
        " default 0.0.0.0)",
    )
    p.add_argument(
        "--port",
        type=port,
        default=env("LJ_EXPORTER_PORT", str(DEFAULT_PORT)),
        help=f"port of /metrics and /healthz (env LJ_EXPORTER_PORT, default {DEFAULT_PORT})",
    )
    p.add_argument(
        "--protocol-file",
        default=env("LJ_EXPORTER_PROTOCOL_FILE"),
        help="protocol.yaml with the resource and annotation names (env"
        " LJ_EXPORTER_PROTOCOL_FILE, default: the built-in names)",
    )
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default=env("LJ_EXPORTER_LOG_LEVEL", "INFO").upper(),
        help="log level (env LJ_EXPORTER_LOG_LEVEL, default INFO)",
    )
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        default=env("LJ_EXPORTER_LOG_FORMAT", "auto"),
        help="json lines, readable text, or auto: text on a terminal, json otherwise"
        " (env LJ_EXPORTER_LOG_FORMAT)",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def _fail(message: str) -> int:
    # One line, even for multi-line causes (a YAML parser's caret display).
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Exporter until SIGTERM or SIGINT; 1 on an operator mistake."""
    args = _parser().parse_args(argv)
    if args.version:
        print(f"{PROG} {component_version(DISTRIBUTION)}")
        return 0
    problem = check_pods_url(args.kubelet_pods_url)
    if problem is not None:
        return _fail(f"--kubelet-pods-url: {problem}")
    if not args.node_name:
        return _fail("--node-name: empty; set it or NODE_NAME (the downward API spec.nodeName)")
    try:
        protocol = load_protocol(args.protocol_file)
    except ProtocolError as exc:
        return _fail(f"--protocol-file: {exc}")
    logs.setup(args.log_level, args.log_format)

    # `_created` series double the counter output and help no dashboard (process-wide switch).
    disable_created_metrics()  # type: ignore[no-untyped-call]
    metrics = ExporterMetrics()
    version = str(component_version(DISTRIBUTION))
    client = RuntimeClient(
        args.runtime_socket_dir,
        args.runtime_socket_name,
        retry=RetryPolicy(
            attempts=2,
            max_delay_s=min(args.collection_interval, 2 * args.runtime_timeout),
            initial_backoff_s=0.1,
            max_backoff_s=1.0,
            call_timeout_s=args.runtime_timeout,
        ),
    )
    fallback: PodLister | None = None
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if args.apiserver_fallback == "auto" and (args.kubeconfig or in_cluster):
        fallback = ApiServerPods(args.node_name, args.kubeconfig, timeout_s=args.kubelet_timeout)
    loop = CollectionLoop(
        client=client,
        pods=NodePods(KubeletPods(args.kubelet_pods_url, args.kubelet_timeout), fallback),
        protocol=protocol,
        metrics=metrics,
        node_name=args.node_name,
        interval_s=args.collection_interval,
        component_version=version,
    )
    try:
        server = MetricsServer(make_app(metrics, loop.healthy), args.listen_address, args.port)
    except OSError as exc:
        return _fail(
            f"--listen-address/--port: cannot listen on {args.listen_address}:{args.port}:"
            f" {exc.strerror or exc}"
        )
    server.start()
    log.info(
        "exporter serving version=%s port=%d node=%s interval_s=%g runtime_socket=%s"
        " kubelet=%s apiserver_fallback=%s protocol=%s",
        version,
        server.port,
        args.node_name,
        args.collection_interval,
        client.socket_path,
        args.kubelet_pods_url,
        "on" if fallback else "off",
        protocol.source,
    )
    try:
        asyncio.run(_run(loop, client))
    finally:
        server.stop()
    log.info("exporter stopped")
    return 0


async def _run(loop: CollectionLoop, client: RuntimeClient) -> None:
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(signum, stop.set)
    try:
        await loop.run(stop)
    finally:
        await client.close()


if __name__ == "__main__":
    sys.exit(main())
