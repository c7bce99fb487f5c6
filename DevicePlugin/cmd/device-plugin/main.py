"""lj-device-plugin: advertise the node's accelerators to the kubelet (device plugin API v1beta1).

Composition root only: flags (mirrored by environment variables), logging,
wiring and signals. Every operator mistake logs one clear line and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lj_runtimekit.deviceplugin.internal.allocate.allocator import Allocator
from lj_runtimekit.deviceplugin.internal.allocate.records import ApiPodRecorder
from lj_runtimekit.deviceplugin.internal.nodelabels.labels import NodeLabeller
from lj_runtimekit.deviceplugin.internal.plugin.manager import PluginManager
from lj_runtimekit.deviceplugin.internal.plugin.server import EndpointError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import NodePods, PodLookupError
from lj_runtimekit.deviceplugin.internal.podlookup.watch import PodWatch
from lj_runtimekit.deviceplugin.internal.podresources.check import (
    DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET,
)
from lj_runtimekit.deviceplugin.internal.podresources.check import PodResourcesClient
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager, RuntimeAccess, Snapshot
from lj_runtimekit.proto.pkg import logs, protocolinfo
from lj_runtimekit.proto.pkg.featuregate import RuntimeTooOldError, evaluate
from lj_runtimekit.proto.pkg.flags import FlagParser, boolean
from lj_runtimekit.proto.pkg.kube import KubeClient, KubeConfigError, NoApiAccessError
from lj_runtimekit.proto.pkg.kubeletpods import DEFAULT_KUBELET_PODS_URL, check_pods_url
from lj_runtimekit.proto.pkg.protocol import (
    ADMISSION_KUBELET_ORDER,
    ADMISSION_SERIAL,
    Protocol,
    ProtocolError,
    load_protocol,
)
from lj_runtimekit.proto.pkg.runtimeclient import (
    DEFAULT_SOCKET_DIR,
    DEFAULT_SOCKET_NAME,
    RetryPolicy,
    RuntimeCallError,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.version import InvalidVersionError, component_version

log = logging.getLogger("lj-device-plugin")

DIST = "lj-runtimekit-deviceplugin"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins/"


class StartError(Exception):
    """The plugin cannot start; the message says what to fix."""


def _parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="lj-device-plugin",
        description="Advertise whole GPUs, TDM core/memory slices, MIG profiles and PPU/AMD"
        " devices of the Lingjun Runtime to the kubelet (device plugin API v1beta1).",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.env_flag(
        "--plugin-dir", "LJ_DP_PLUGIN_DIR", DEFAULT_PLUGIN_DIR, "kubelet device plugin directory"
    )
    p.env_flag(
        "--runtime-socket-dir",
        "LJ_RUNTIME_SOCKET_DIR",
        DEFAULT_SOCKET_DIR,
        "Runtime socket directory",
    )
    p.env_flag(
        "--runtime-socket-name",
        "LJ_RUNTIME_SOCKET_NAME",
        DEFAULT_SOCKET_NAME,
        "Runtime socket file name",
    )
    p.protocol_flag(
        "protocol.yaml with resource, label and annotation names", old_flags=("--protocol",)
    )
    p.env_flag(
        "--node-name",
        "NODE_NAME",
        "",
        "this node's name, for labels and the API server's pod watch",
        shown="none",
    )
    p.env_flag(
        "--kubelet-pods-url",
        "LJ_DP_KUBELET_PODS_URL",
        DEFAULT_KUBELET_PODS_URL,
        "kubelet read-only pod list; empty: off, the API server's watch of the node's pods only",
    )
    p.env_flag(
        "--pod-resources-socket",
        "LJ_DP_POD_RESOURCES_SOCKET",
        DEFAULT_POD_RESOURCES_SOCKET,
        "kubelet PodResources socket, to cross-check the kubelet's record of each"
        " container's devices against the allocations every clean-up round; empty: off",
    )
    p.env_flag(
        "--kubeconfig",
        "KUBECONFIG",
        None,
        "kubeconfig for API server access",
        shown="in-cluster config",
    )
    p.env_flag(
        "--label-node",
        "LJ_DP_LABEL_NODE",
        "true",
        "label the Node with device kind, model, count, mode and Runtime version (needs API"
        " access and --node-name)",
        type=boolean,
    )
    p.env_flag(
        "--release-grace",
        "LJ_DP_RELEASE_GRACE_S",
        "60",
        "seconds a pod may be missing from the pod list before its Runtime allocation is released",
        type=float,
    )
    p.env_flag(
        "--collect-interval",
        "LJ_DP_COLLECT_INTERVAL_S",
        "30",
        "seconds between clean-up rounds of finished pods' allocations",
        type=float,
    )
    p.env_flag(
        "--require-assignment-uid",
        "LJ_DP_REQUIRE_ASSIGNMENT_UID",
        "false",
        "refuse a pod whose assignment names no pod UID (written by an older scheduler, or"
        " copied with its UID removed); turn on once the scheduler is upgraded",
        type=boolean,
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=2.0,
        help="seconds open streams get on shutdown (default 2)",
    )
    p.log_flags("LJ_DP_")
    return p


@dataclass(frozen=True)
class Config:
    """Validated settings."""

    plugin_dir: Path
    runtime_socket_dir: str
    runtime_socket_name: str
    protocol: Protocol
    node_name: str
    kubelet_pods_url: str
    pod_resources_socket: str
    kube: KubeClient | None
    label_node: bool
    release_grace_s: float
    collect_interval_s: float
    grace_s: float
    require_assignment_uid: bool


def _config(args: argparse.Namespace) -> Config:
    try:
        protocol = load_protocol(args.protocol_file)
    except ProtocolError as exc:
        raise StartError(str(exc)) from exc
    kube: KubeClient | None
    try:
        kube = KubeClient.connect(args.kubeconfig)
    except NoApiAccessError:
        kube = None
    except KubeConfigError as exc:
        raise StartError(str(exc)) from exc
    if args.label_node and kube is None:
        raise StartError(
            "--label-node needs API server access: run in-cluster or pass --kubeconfig,"
            " or set --label-node=false"
        )
    if args.label_node and not args.node_name:
        raise StartError("--label-node needs the node name: set --node-name or NODE_NAME")
    problem = check_pods_url(args.kubelet_pods_url) if args.kubelet_pods_url else None
    if problem is not None:
        raise StartError(f"--kubelet-pods-url: {problem}")
    if not args.kubelet_pods_url and (kube is None or not args.node_name):
        raise StartError(
            "no source for the node's pods: --kubelet-pods-url is empty and there is no API"
            " server access with a node name (--kubeconfig or in-cluster, and --node-name)"
        )
    for flag in ("release_grace", "collect_interval", "grace_period"):
        if getattr(args, flag) < 0:
            raise StartError(f"--{flag.replace('_', '-')} must not be negative")
    return Config(
        plugin_dir=Path(args.plugin_dir),
        runtime_socket_dir=args.runtime_socket_dir,
        runtime_socket_name=args.runtime_socket_name,
        protocol=protocol,
        node_name=args.node_name,
        kubelet_pods_url=args.kubelet_pods_url,
        pod_resources_socket=args.pod_resources_socket,
        kube=kube,
        label_node=args.label_node,
        release_grace_s=args.release_grace,
        collect_interval_s=max(args.collect_interval, 0.1),
        grace_s=args.grace_period,
        require_assignment_uid=args.require_assignment_uid,
    )


async def _run(cfg: Config) -> None:
    runtime = RuntimeAccess(cfg.runtime_socket_dir, cfg.runtime_socket_name, RetryPolicy())
    watch = PodWatch(cfg.kube, cfg.node_name) if cfg.kube is not None and cfg.node_name else None
    pods = NodePods(cfg.kubelet_pods_url, cfg.node_name, cfg.kube, watch=watch)
    try:
        try:
            await pods.list_pods()
        except PodLookupError as exc:
            # Without the node's pods no Allocate can be answered: refuse to start rather
            # than advertise devices the kubelet would then fail to admit.
            raise StartError(str(exc)) from exc
        log.info("pod source", extra={"source": pods.describe()})
        try:
            info = await runtime.client.runtime_info()
            gates = evaluate(info.version, component_version(DIST))
            gates.require_base()
            devices = tuple(await runtime.client.list_devices())
        except (RuntimeUnavailableError, RuntimeCallError, RuntimeTooOldError) as exc:
            raise StartError(str(exc)) from exc
        except InvalidVersionError as exc:
            raise StartError(f"Runtime reports a bad version: {exc}") from exc
        log.info(
            "runtime found",
            extra={"version": info.version, "node": info.node_name, "devices": len(devices)},
        )
        for message in gates.messages:
            log.warning("feature gate", extra={"detail": message})
        own = component_version(DIST)
        rm = ResourceManager(
            runtime, cfg.protocol, gates, devices, gates_for=lambda v: evaluate(v, own)
        )
        await _serve(cfg, runtime, pods, rm)
    finally:
        await pods.aclose()
        await runtime.close()


async def _serve(cfg: Config, runtime: RuntimeAccess, pods: NodePods, rm: ResourceManager) -> None:
    recorder = ApiPodRecorder(cfg.kube) if cfg.kube else None
    if recorder is None:
        log.warning("no API server access: allocation records are kept by the Runtime only")
    allocator = Allocator(
        rm,
        runtime,
        pods,
        cfg.protocol,
        recorder=recorder,
        node_name=cfg.node_name,
        release_grace_s=cfg.release_grace_s,
        pod_resources=(
            PodResourcesClient(cfg.pod_resources_socket) if cfg.pod_resources_socket else None
        ),
        require_assignment_uid=cfg.require_assignment_uid,
    )
    try:
        await allocator.rebuild()
    except (RuntimeUnavailableError, RuntimeCallError) as exc:
        raise StartError(f"cannot read the Runtime's allocations: {exc}") from exc
    if cfg.label_node and cfg.kube is not None:
        # Before the sockets (readiness): a ready pod has reported the protocol it runs.
        await protocolinfo.annotate_node(cfg.kube, cfg.node_name, cfg.protocol)
    manager = PluginManager(cfg.plugin_dir, rm, allocator, grace_s=cfg.grace_s)
    try:
        await manager.start()
    except EndpointError as exc:
        await manager.stop()
        raise StartError(str(exc)) from exc

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    tasks: list[asyncio.Task[None]] = [
        asyncio.create_task(rm.run(), name="runtime-watch"),
        asyncio.create_task(allocator.run_collector(stop, cfg.collect_interval_s), name="gc"),
    ]
    if cfg.label_node and cfg.kube is not None:
        labeller = NodeLabeller(cfg.kube, cfg.node_name)
        pending: asyncio.Queue[Snapshot] = asyncio.Queue()
        rm.add_listener(pending.put_nowait)
        # With the kubelet's own pod list a pod shows up as the kubelet starts admitting
        # it, one at a time: the scheduler need not wait between this node's device pods.
        admission = ADMISSION_KUBELET_ORDER if cfg.kubelet_pods_url else ADMISSION_SERIAL
        follow = labeller.follow(pending, rm.snapshot, cfg.protocol, admission)
        tasks.append(asyncio.create_task(follow, name="labels"))
    log.info(
        "serving",
        extra={"resources": ",".join(sorted(manager.endpoints)), "plugin_dir": cfg.plugin_dir},
    )
    try:
        await manager.run(stop)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await allocator.close()
        log.info("stopped, sockets removed")


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM or SIGINT; 1 on an operator mistake or an unusable Runtime."""
    args = _parser().parse_args(argv)
    if args.version:
        print(f"lj-device-plugin {component_version(DIST)}")
        return 0
    logs.setup(args.log_level, args.log_format)
    try:
        cfg = _config(args)
        asyncio.run(_run(cfg))
    except StartError as exc:
        log.error("cannot start", extra={"reason": str(exc)})
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
