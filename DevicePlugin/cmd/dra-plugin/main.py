"""lj-dra-plugin: the DRA kubelet plugin of the Lingjun Runtime (resource.k8s.io/v1).

Composition root only: flags (mirrored by environment variables), logging, wiring and
signals. It publishes the node's ResourceSlices, serves NodePrepareResources,
NodeUnprepareResources and the devices' health (NodeWatchResources), and registers with
the kubelet. `--remove-slices` deletes the
node's slices and exits (uninstall). Every operator mistake logs one clear line and
exits 1.
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

from lj_runtimekit.deviceplugin.internal.dra.cdi import CdiSpecs
from lj_runtimekit.deviceplugin.internal.dra.checkpoint import Checkpoint, CheckpointError
from lj_runtimekit.deviceplugin.internal.dra.health import HealthServicer
from lj_runtimekit.deviceplugin.internal.dra.prepare import Preparer
from lj_runtimekit.deviceplugin.internal.dra.publisher import SlicePublisher
from lj_runtimekit.deviceplugin.internal.dra.server import PluginServers, ServerError
from lj_runtimekit.proto.pkg import logs
from lj_runtimekit.proto.pkg.flags import FlagParser
from lj_runtimekit.proto.pkg.kube import (
    KubeClient,
    KubeConfigError,
    KubeError,
    NoApiAccessError,
    call_async,
)
from lj_runtimekit.proto.pkg.kube import (
    RetryPolicy as KubeRetryPolicy,
)
from lj_runtimekit.proto.pkg.protocol import Protocol, ProtocolError, load_protocol
from lj_runtimekit.proto.pkg.runtimeclient import (
    DEFAULT_SOCKET_DIR,
    DEFAULT_SOCKET_NAME,
    RetryPolicy,
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.proto.pkg.version import component_version

log = logging.getLogger("lj-dra-plugin")

DIST = "lj-runtimekit-deviceplugin"
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"
API_CHECK = KubeRetryPolicy(attempts=3, timeout_s=10.0, initial_s=0.2, jitter_s=0.2)


class StartError(Exception):
    """The plugin cannot start; the message says what to fix."""


def _parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="lj-dra-plugin",
        description="DRA kubelet plugin of the Lingjun Runtime: publishes the node's devices"
        " as ResourceSlices and prepares allocated ResourceClaims (resource.k8s.io/v1).",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.env_flag("--node-name", "NODE_NAME", "", "this node's name (its slices' pool)", shown="none")
    p.env_flag(
        "--runtime-socket",
        "LJ_RUNTIME_SOCKET",
        str(Path(DEFAULT_SOCKET_DIR) / DEFAULT_SOCKET_NAME),
        "the Runtime's socket",
    )
    p.env_flag(
        "--kubelet-dir",
        "LJ_DRA_KUBELET_DIR",
        DEFAULT_KUBELET_DIR,
        "the kubelet's directory (plugins/<driver>/dra.sock, plugins_registry/)",
    )
    p.env_flag("--cdi-dir", "LJ_DRA_CDI_DIR", DEFAULT_CDI_DIR, "CDI spec directory")
    p.env_flag(
        "--state-dir",
        "LJ_DRA_STATE_DIR",
        "",
        "directory of the checkpoint of prepared claims",
        shown="<kubelet-dir>/plugins/<driver>",
    )
    p.protocol_flag("protocol.yaml with the DRA driver name")
    p.env_flag(
        "--kubeconfig",
        "KUBECONFIG",
        None,
        "kubeconfig for API server access",
        shown="in-cluster config",
    )
    p.add_argument(
        "--remove-slices",
        action="store_true",
        help="delete this node's ResourceSlices and exit (uninstall)",
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=2.0,
        help="seconds open calls get on shutdown (default 2)",
    )
    p.log_flags("LJ_DRA_")
    return p


@dataclass(frozen=True)
class Config:
    """Validated settings."""

    node_name: str
    runtime_socket: Path
    kubelet_dir: Path
    cdi_dir: Path
    state_dir: Path
    protocol: Protocol
    kube: KubeClient
    remove_slices: bool
    grace_s: float


def _config(args: argparse.Namespace) -> Config:
    if not args.node_name:
        raise StartError("the node name is missing: set --node-name or NODE_NAME")
    try:
        protocol = load_protocol(args.protocol_file)
    except ProtocolError as exc:
        raise StartError(str(exc)) from exc
    try:
        kube = KubeClient.connect(args.kubeconfig)
    except NoApiAccessError as exc:
        raise StartError(
            f"no API server access: run in-cluster or pass --kubeconfig ({exc})"
        ) from exc
    except KubeConfigError as exc:
        raise StartError(str(exc)) from exc
    if args.grace_period < 0:
        raise StartError("--grace-period must not be negative")
    kubelet_dir = Path(args.kubelet_dir)
    driver = protocol.dra.driver
    return Config(
        node_name=args.node_name,
        runtime_socket=Path(args.runtime_socket),
        kubelet_dir=kubelet_dir,
        cdi_dir=Path(args.cdi_dir),
        state_dir=Path(args.state_dir) if args.state_dir else kubelet_dir / "plugins" / driver,
        protocol=protocol,
        kube=kube,
        remove_slices=args.remove_slices,
        grace_s=args.grace_period,
    )


async def _check_api(cfg: Config) -> None:
    """The API server answers and knows this node."""
    path = f"/api/v1/nodes/{cfg.node_name}"
    try:
        await call_async(f"GET {path}", lambda: cfg.kube.request("GET", path), API_CHECK)
    except KubeError as exc:
        raise StartError(f"API server {cfg.kube.host}: node {cfg.node_name}: {exc}") from exc


async def _run(cfg: Config) -> None:
    runtime = RuntimeClient(cfg.runtime_socket.parent, cfg.runtime_socket.name, RetryPolicy())
    try:
        await _check_api(cfg)
        if cfg.remove_slices:
            await SlicePublisher(cfg.kube, runtime, cfg.protocol, cfg.node_name).remove()
            log.info("slices removed", extra={"node": cfg.node_name})
            return
        driver = cfg.protocol.dra.driver
        # Each needs the other: claims are resolved against the inventory the publisher
        # follows, and a Runtime the publisher finds back gets its lost claims again.
        publisher = SlicePublisher(
            cfg.kube,
            runtime,
            cfg.protocol,
            cfg.node_name,
            on_reconnect=lambda: preparer.restore_lost(),
        )
        preparer = Preparer(
            cfg.kube,
            runtime,
            driver,
            cfg.node_name,
            CdiSpecs(cfg.cdi_dir, driver),
            Checkpoint(cfg.state_dir),
            inventory=publisher.inventory,
        )
        try:
            done = await preparer.reconcile()
        except (CheckpointError, RuntimeUnavailableError, RuntimeCallError) as exc:
            raise StartError(str(exc)) from exc
        log.info(
            "checkpoint reconciled",
            extra={
                "prepared": len(preparer.prepared),
                "reallocated": len(done.reallocated),
                "released": len(done.released),
            },
        )
        await _serve(cfg, preparer, publisher, HealthServicer(runtime, cfg.node_name))
    finally:
        await runtime.close()
        cfg.kube.close()


async def _serve(
    cfg: Config, preparer: Preparer, publisher: SlicePublisher, health: HealthServicer
) -> None:
    servers = PluginServers(cfg.kubelet_dir, cfg.protocol.dra.driver, preparer, health)
    try:
        await servers.start()
    except ServerError as exc:
        raise StartError(str(exc)) from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    publishing = asyncio.create_task(publisher.run(), name="slices")
    stopping = asyncio.create_task(stop.wait(), name="stop")
    try:
        await asyncio.wait({publishing, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (publishing, stopping):
            task.cancel()
        await asyncio.gather(publishing, stopping, return_exceptions=True)
        await servers.stop(cfg.grace_s)
        log.info("stopped, sockets removed (slices stay)")
    if not stop.is_set():
        error = None if publishing.cancelled() else publishing.exception()
        raise StartError(f"the slice publisher ended: {error!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM or SIGINT; 1 on an operator mistake or an unusable Runtime."""
    args = _parser().parse_args(argv)
    if args.version:
        print(f"lj-dra-plugin {component_version(DIST)}")
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
