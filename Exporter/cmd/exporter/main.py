"""lj-exporter: Prometheus metrics per accelerator, MIG instance and pod of one node.

The composition root: flags (mirrored by LJ_EXPORTER_* environment variables),
the protocol file, logging, wiring, signals. Every operator mistake is one log
line and exit status 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Sequence

from prometheus_client import disable_created_metrics

from lj_runtimekit.exporter.internal.collector.loop import CollectionLoop
from lj_runtimekit.exporter.internal.metrics.labels import LabelConfig, pod_label_allowlist
from lj_runtimekit.exporter.internal.metrics.registry import ExporterMetrics
from lj_runtimekit.exporter.internal.pods.apiserver import ApiServerPods
from lj_runtimekit.exporter.internal.pods.kubelet import KubeletPods
from lj_runtimekit.exporter.internal.pods.podresources import (
    DEFAULT_POD_RESOURCES_SOCKET,
    PodResourcesReader,
)
from lj_runtimekit.exporter.internal.pods.source import NodePods
from lj_runtimekit.exporter.internal.server.http import MetricsServer, make_app
from lj_runtimekit.proto.pkg import logs, protocolinfo
from lj_runtimekit.proto.pkg.flags import FlagParser, boolean, port, positive_seconds
from lj_runtimekit.proto.pkg.kube import in_cluster
from lj_runtimekit.proto.pkg.kubeletpods import DEFAULT_KUBELET_PODS_URL, check_pods_url
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
    p = FlagParser(
        prog=PROG,
        description="Serve Prometheus metrics of the node's accelerators (devices, MIG"
        " instances) and of the containers using them, read from the Lingjun Runtime and"
        " the kubelet. Every flag has an LJ_EXPORTER_* environment variable.",
    )
    p.env_flag(
        "--runtime-socket-dir",
        "LJ_EXPORTER_RUNTIME_SOCKET_DIR",
        DEFAULT_SOCKET_DIR,
        "directory of the Runtime sockets",
    )
    p.env_flag(
        "--runtime-socket-name",
        "LJ_EXPORTER_RUNTIME_SOCKET_NAME",
        DEFAULT_SOCKET_NAME,
        "Runtime socket file name",
    )
    p.env_flag(
        "--runtime-timeout",
        "LJ_EXPORTER_RUNTIME_TIMEOUT",
        "5",
        "seconds one Runtime call may take",
        type=positive_seconds,
    )
    p.env_flag(
        "--kubelet-pods-url",
        "LJ_EXPORTER_KUBELET_PODS_URL",
        DEFAULT_KUBELET_PODS_URL,
        "the kubelet read-only /pods endpoint; empty: not used, the node's pods come from"
        " one API server watch (needs --kubeconfig or a cluster)",
    )
    p.env_flag(
        "--kubelet-timeout",
        "LJ_EXPORTER_KUBELET_TIMEOUT",
        "5",
        "seconds a /pods request, or the API server watch's first list, may take",
        type=positive_seconds,
    )
    p.env_flag(
        "--pod-resources-socket",
        "LJ_EXPORTER_POD_RESOURCES_SOCKET",
        DEFAULT_POD_RESOURCES_SOCKET,
        "the kubelet's PodResources socket: which containers use the DRA claims the Runtime"
        " holds (read only while it holds some); empty: not read",
    )
    p.env_flag(
        "--apiserver-fallback",
        "LJ_EXPORTER_APISERVER_FALLBACK",
        "auto",
        "watch the node's pods on the API server (by spec.nodeName) while the kubelet"
        " does not answer: auto = when running in a cluster or --kubeconfig is given",
        choices=("auto", "off"),
    )
    p.env_flag(
        "--kubeconfig",
        ("LJ_EXPORTER_KUBECONFIG", "KUBECONFIG"),
        None,
        "kubeconfig for the API server watch",
        shown="in-cluster config",
    )
    p.env_flag(
        "--node-name",
        ("LJ_EXPORTER_NODE_NAME", "NODE_NAME"),
        socket.gethostname(),
        "this node's name: the `node` label and the API server watch's field selector",
        shown="the host name",
    )
    p.env_flag(
        "--collection-interval",
        "LJ_EXPORTER_COLLECTION_INTERVAL",
        str(DEFAULT_INTERVAL_S),
        "seconds between background collections",
        shown=f"{DEFAULT_INTERVAL_S:g}",
        type=positive_seconds,
    )
    p.env_flag(
        "--listen-address",
        "LJ_EXPORTER_LISTEN_ADDRESS",
        "0.0.0.0",
        "address of the HTTP server, `::` for IPv6",
    )
    p.env_flag(
        "--port",
        "LJ_EXPORTER_PORT",
        str(DEFAULT_PORT),
        "port of /metrics and /healthz",
        type=port,
    )
    p.protocol_flag(
        "protocol.yaml with the resource and annotation names",
        old_env=("LJ_EXPORTER_PROTOCOL_FILE",),
    )
    p.env_flag(
        "--dcgm-label-names",
        "LJ_EXPORTER_DCGM_LABEL_NAMES",
        "false",
        "name the labels as dcgm-exporter does (Hostname, gpu, UUID, modelName, GPU_I_PROFILE,"
        " GPU_I_ID) so its dashboards select these series",
        type=boolean,
    )
    p.env_flag(
        "--pod-labels",
        "LJ_EXPORTER_POD_LABELS",
        "",
        "comma-separated pod label keys copied onto the container series as label_<key>"
        " (characters outside [a-zA-Z0-9_] become _)",
        shown="none",
        type=pod_label_allowlist,
    )
    p.env_flag(
        "--pod-uid-label",
        "LJ_EXPORTER_POD_UID_LABEL",
        "false",
        "add the pod's UID as the pod_uid label of the container series",
        type=boolean,
    )
    p.log_flags("LJ_EXPORTER_")
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
    problem = check_pods_url(args.kubelet_pods_url) if args.kubelet_pods_url else None
    if problem is not None:
        return _fail(f"--kubelet-pods-url: {problem}")
    api_access = args.apiserver_fallback == "auto" and bool(args.kubeconfig or in_cluster())
    if not args.kubelet_pods_url and not api_access:
        return _fail(
            "--kubelet-pods-url: empty (kubelet not used) needs the API server's pod watch:"
            " --apiserver-fallback auto and --kubeconfig or a cluster (KUBERNETES_SERVICE_HOST)"
        )
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
    metrics.protocol.labels(protocolinfo.protocol_sha256(protocol)).set(1)
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
    fallback = (
        ApiServerPods(args.node_name, args.kubeconfig, sync_timeout_s=args.kubelet_timeout)
        if api_access
        else None
    )
    kubelet = (
        KubeletPods(args.kubelet_pods_url, args.kubelet_timeout) if args.kubelet_pods_url else None
    )
    pod_resources = (
        PodResourcesReader(args.pod_resources_socket, args.kubelet_timeout)
        if args.pod_resources_socket
        else None
    )
    loop = CollectionLoop(
        client=client,
        pod_resources=pod_resources,
        pods=NodePods(kubelet, fallback),
        protocol=protocol,
        metrics=metrics,
        node_name=args.node_name,
        interval_s=args.collection_interval,
        component_version=version,
        label_config=LabelConfig(
            dcgm_names=args.dcgm_label_names,
            pod_labels=args.pod_labels,
            pod_uid=args.pod_uid_label,
        ),
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
        "exporter serving",
        extra={
            "version": version,
            "port": server.port,
            "node": args.node_name,
            "interval_s": args.collection_interval,
            "runtime_socket": client.socket_path,
            "kubelet": args.kubelet_pods_url or "not used",
            "pod_resources": args.pod_resources_socket or "not used",
            "apiserver_watch": ("only" if kubelet is None else "fallback") if fallback else "off",
            "protocol": protocol.source,
        },
    )
    try:
        asyncio.run(_run(loop, client, kubelet, pod_resources))
    finally:
        if fallback is not None:
            fallback.stop()
        server.stop()
    log.info("exporter stopped")
    return 0


async def _run(
    loop: CollectionLoop,
    client: RuntimeClient,
    kubelet: KubeletPods | None,
    pod_resources: PodResourcesReader | None,
) -> None:
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(signum, stop.set)
    try:
        await loop.run(stop)
    finally:
        if kubelet is not None:
            await kubelet.aclose()
        if pod_resources is not None:
            await pod_resources.close()
        await client.close()


if __name__ == "__main__":
    sys.exit(main())
