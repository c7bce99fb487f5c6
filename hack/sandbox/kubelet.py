"""lj-sandbox-kubelet: the kubelet of one KWOK Lingjun node in the sandbox.

KWOK fakes a node's status and its pods' lifecycles but has no device manager.
This process plays the kubelet's part that the Runtime Kit depends on, on the
real protocols:

- the device manager: the Device Plugin's `KubeletShim` (registration on
  `<plugin-dir>/kubelet.sock`, ListAndWatch, GetPreferredAllocation, Allocate);
- node status: each registered resource's device count is patched into the
  Node's capacity and its healthy count into allocatable (0 while the plugin's
  stream is down), as the kubelet does;
- admission: every pod bound to the node is admitted one at a time; for each
  container it calls Allocate per device resource, as the kubelet's admission
  does. Success writes the device IDs given to each container onto the pod
  (annotation `sandbox.lj-runtimekit.io/admitted`, the kubelet's checkpoint:
  a restarted shim rebuilds its in-use set from it), which lets KWOK make the
  pod Running. Failure marks the pod Failed with reason
  UnexpectedAdmissionError, the plugin's message, and a Warning event;
- containers of Job pods whose command is a Runtime Kit tool (`lj-job-agent`)
  are really run, on this host, with the pod's hostPath volumes mapped onto
  this node's directories (`--host-path HOST=LOCAL`, e.g. the Runtime socket
  directory onto this node's simulator): the Job Agent reaches this node's
  Runtime. Its exit code and termination message decide the pod's fate
  (KWOK completes it, or fails it with that message);
- the read-only port's `GET /pods` (`--pods-port`): the node's pods as the
  Device Plugin and the Exporter read them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

from lj_runtimekit.deviceplugin.internal.kubeletshim.kubelet import AdmissionError, KubeletShim
from lj_runtimekit.deviceplugin.internal.kubeletshim.pods import PodListServer
from lj_runtimekit.envtest.kwok import failure_annotations
from lj_runtimekit.proto.pkg.protocol import Protocol, ProtocolError, load_protocol
from lj_runtimekit.sandbox.stages import ADMITTED_ANNOTATION

log = logging.getLogger("lj-sandbox-kubelet")

PodObject = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")
RUNNABLE_COMMANDS = ("lj-job-agent",)
"""Container commands the shim runs for real (Runtime Kit tools installed beside it)."""
ADMISSION_REASON = "UnexpectedAdmissionError"


class ConfigError(Exception):
    """An operator mistake in the flags."""


@dataclass(frozen=True)
class KubeletConfig:
    """Validated settings of one node's kubelet shim."""

    node_name: str
    plugin_dir: Path
    pods_port: int
    kubeconfig: str
    protocol: Protocol
    host_paths: Mapping[str, str] = field(default_factory=dict)
    register_wait_s: float = 30.0
    container_timeout_s: float = 120.0


@dataclass
class ContainerResult:
    """How a container the shim ran ended."""

    exit_code: int
    message: str


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    return meta


def _ref(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _uid(pod: Mapping[str, Any]) -> str:
    return str(_meta(pod).get("uid", ""))


def _finished(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in TERMINAL or bool(_meta(pod).get("deletionTimestamp"))


def _job_owned(pod: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "Job" for o in _meta(pod).get("ownerReferences") or ())


class NodeKubelet:
    """The kubelet shim of one node; `run()` until the stop event."""

    def __init__(self, cfg: KubeletConfig, api: k8s_client.ApiClient) -> None:
        self.cfg = cfg
        self.core = k8s_client.CoreV1Api(api)
        self.shim = KubeletShim(cfg.plugin_dir)
        self.pods = PodListServer(port=cfg.pods_port)
        self.known: dict[str, PodObject] = {}
        self.admitted: set[str] = set()
        self.rejected: set[str] = set()
        self.queued: set[str] = set()
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._admissions: asyncio.Queue[str] = asyncio.Queue()
        self._stop_watch = threading.Event()
        self._synced = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set."""
        loop = asyncio.get_running_loop()
        watcher = threading.Thread(target=self._watch, args=(loop,), name="pod-watch", daemon=True)
        watcher.start()
        consumer = asyncio.create_task(self._consume(), name="pod-events")
        # Serve /pods and the device manager only once the node's pods are known: an empty
        # list after a restart would tell the Device Plugin every pod had gone.
        await self._synced.wait()
        await self.shim.start()
        self.pods.start()
        log.info(
            "kubelet shim up node=%s plugin_dir=%s pods=%s",
            self.cfg.node_name,
            self.cfg.plugin_dir,
            self.pods.url,
        )
        tasks = [
            consumer,
            asyncio.create_task(self._admit_loop(), name="admission"),
            asyncio.create_task(self._capacity_loop(), name="node-status"),
        ]
        try:
            await stop.wait()
        finally:
            self._stop_watch.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.shim.stop()
            self.pods.stop()
            log.info("kubelet shim stopped node=%s", self.cfg.node_name)

    # -- pods of the node -----------------------------------------------------------------

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """List and watch the node's pods (a thread: the client is blocking)."""
        selector = f"spec.nodeName={self.cfg.node_name}"

        def put(item: tuple[str, Any]) -> None:
            loop.call_soon_threadsafe(self._events.put_nowait, item)

        while not self._stop_watch.is_set():
            try:
                response = self.core.list_pod_for_all_namespaces(
                    field_selector=selector, _preload_content=False
                )
                listed = json.loads(response.data)
                put(("SYNC", listed.get("items") or []))
                version = listed["metadata"]["resourceVersion"]
                stream = k8s_watch.Watch()
                for event in stream.stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=version,
                    timeout_seconds=60,
                ):
                    if self._stop_watch.is_set():
                        stream.stop()
                        return
                    kind = event.get("type")
                    if kind == "ERROR":
                        break
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        put((str(kind), event["raw_object"]))
            except Exception as exc:
                if self._stop_watch.is_set():
                    return
                log.warning("pod watch failed node=%s reason=%r", self.cfg.node_name, str(exc))
                time.sleep(1.0)

    async def _consume(self) -> None:
        while True:
            kind, payload = await self._events.get()
            if kind == "SYNC":
                items: list[PodObject] = payload
                present = {_uid(p) for p in items}
                for uid in list(self.known):
                    if uid not in present:
                        self._forget(uid)
                for pod in items:
                    self._observe(pod)
                self._synced.set()
            elif kind == "DELETED":
                self._forget(_uid(payload))
            else:
                self._observe(payload)

    def _forget(self, uid: str) -> None:
        self.known.pop(uid, None)
        self.pods.remove(uid)
        freed = self.shim.free(uid)
        if freed:
            log.info("pod gone, devices freed uid=%s devices=%d", uid, freed)
        self.admitted.discard(uid)
        self.rejected.discard(uid)

    def _observe(self, pod: PodObject) -> None:
        uid = _uid(pod)
        self.known[uid] = pod
        self.pods.put(pod)
        if _finished(pod):
            if self.shim.free(uid):
                log.info("pod finished, devices freed pod=%s", _ref(pod))
            return
        if uid in self.admitted or uid in self.rejected or uid in self.queued:
            return
        checkpoint = (_meta(pod).get("annotations") or {}).get(ADMITTED_ANNOTATION)
        if checkpoint is not None:
            self._restore(pod, checkpoint)
            return
        self.queued.add(uid)
        self._admissions.put_nowait(uid)

    def _restore(self, pod: PodObject, checkpoint: str) -> None:
        """Take back the device IDs a previous run of the shim gave the pod."""
        uid = _uid(pod)
        self.admitted.add(uid)
        try:
            given = json.loads(checkpoint)
            for container, resources in given.items():
                for resource, ids in resources.items():
                    used = self.shim.in_use.setdefault(resource, {})
                    for device in ids:
                        used[device] = f"{uid}/{container}"
        except (ValueError, AttributeError, TypeError) as exc:
            log.warning(
                "unreadable admission checkpoint pod=%s annotation=%s reason=%r",
                _ref(pod),
                ADMITTED_ANNOTATION,
                str(exc),
            )

    # -- admission ------------------------------------------------------------------------

    def _device_resources(self, pod: Mapping[str, Any]) -> set[str]:
        res = self.cfg.protocol.resources
        fixed = {res.gpu, res.core, res.memory, res.ppu, res.amd}
        mig_head = f"{res.mig_prefix}/mig-"
        spec = pod.get("spec") or {}
        out: set[str] = set()
        for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            for name in (container.get("resources") or {}).get("limits") or {}:
                if name in fixed or name.startswith(mig_head):
                    out.add(name)
        return out

    async def _admit_loop(self) -> None:
        while True:
            uid = await self._admissions.get()
            self.queued.discard(uid)
            pod = self.known.get(uid)
            if pod is None or _finished(pod) or uid in self.admitted:
                continue
            try:
                await self._admit(pod)
            except Exception:
                log.exception("admission crashed pod=%s", _ref(pod))

    async def _admit(self, pod: PodObject) -> None:
        uid = _uid(pod)
        needed = self._device_resources(pod)

        def registered() -> bool:
            return all(
                r in self.shim.plugins
                and self.shim.plugins[r].first_update is not None
                and self.shim.plugins[r].stream_error is None
                for r in needed
            )

        try:
            await self.shim.wait_for(registered, self.cfg.register_wait_s)
        except TimeoutError:
            missing = sorted(r for r in needed if r not in self.shim.plugins)
            down = sorted(
                r for r in needed if r in self.shim.plugins and self.shim.plugins[r].stream_error
            )
            await self._reject(
                pod,
                f"no device plugin serving {', '.join(missing + down)} on node"
                f" {self.cfg.node_name} within {self.cfg.register_wait_s:.0f}s"
                f" (not registered: {missing or 'none'}; stream down: {down or 'none'})",
            )
            return
        pod = self.known.get(uid, pod)
        try:
            options = await self.shim.admit(pod)
        except AdmissionError as exc:
            # As the kubelet: a failed Allocate fails the pod (it is never retried; the
            # plugin may have allocated part of it, which it releases once the pod failed).
            self.shim.free(uid)
            await self._reject(pod, f"Allocate failed: {exc}")
            return
        checkpoint = {c: o.device_ids for c, o in options.items() if o.device_ids}
        annotations = {ADMITTED_ANNOTATION: json.dumps(checkpoint, sort_keys=True)}
        if _job_owned(pod):
            result = await self._run_containers(pod)
            if result is not None and result.exit_code != 0:
                annotations.update(
                    failure_annotations(min(result.exit_code, 255), result.message or "failed")
                )
        try:
            await asyncio.to_thread(
                self.core.patch_namespaced_pod,
                _meta(pod)["name"],
                _meta(pod)["namespace"],
                {"metadata": {"annotations": annotations}},
            )
        except ApiException as exc:
            if exc.status == 404:
                self.shim.free(uid)
                return
            raise
        self.admitted.add(uid)
        devices = sum(len(ids) for c in checkpoint.values() for ids in c.values())
        log.info("pod admitted pod=%s device_ids=%d", _ref(pod), devices)

    async def _reject(self, pod: PodObject, message: str) -> None:
        """Fail the pod as the kubelet does on an admission error, with a Warning event."""
        meta = _meta(pod)
        self.rejected.add(_uid(pod))
        log.warning("pod rejected pod=%s reason=%r", _ref(pod), message)
        status = {"status": {"phase": "Failed", "reason": ADMISSION_REASON, "message": message}}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": ADMISSION_REASON,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": self.cfg.node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await asyncio.to_thread(
                self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"], status
            )
            await asyncio.to_thread(self.core.create_namespaced_event, meta["namespace"], event)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("rejection not recorded pod=%s reason=%r", _ref(pod), str(exc))

    # -- containers of Job pods -----------------------------------------------------------

    def _host_path(self, path: str) -> str:
        """A hostPath of the pod mapped onto this node's directories."""
        for host, local in self.cfg.host_paths.items():
            if path.rstrip("/") == host.rstrip("/"):
                return local
        return path

    async def _run_containers(self, pod: PodObject) -> ContainerResult | None:
        """Run the pod's containers whose command is a Runtime Kit tool; the last failure
        (or the last result) decides. None when no container is runnable."""
        spec = pod.get("spec") or {}
        volumes = {
            v.get("name"): self._host_path(str(v["hostPath"]["path"]))
            for v in spec.get("volumes") or ()
            if v.get("hostPath")
        }
        result: ContainerResult | None = None
        for container in spec.get("containers") or ():
            command = list(container.get("command") or ())
            if not command or Path(command[0]).name not in RUNNABLE_COMMANDS:
                continue
            binary = shutil.which(Path(command[0]).name, path=str(Path(sys.executable).parent))
            if binary is None:
                return ContainerResult(127, f"{command[0]} is not installed beside the sandbox")
            outcome = await self._run_one(pod, container, binary, volumes)
            if result is None or outcome.exit_code != 0:
                result = outcome
            if outcome.exit_code != 0:
                break
        return result

    async def _run_one(
        self,
        pod: PodObject,
        container: Mapping[str, Any],
        binary: str,
        volumes: Mapping[str, str],
    ) -> ContainerResult:
        mounts = {
            str(m["mountPath"]): volumes[m["name"]]
            for m in container.get("volumeMounts") or ()
            if m.get("name") in volumes
        }
        with tempfile.TemporaryDirectory(prefix="lj-term-") as tmp:
            term_path = str(container.get("terminationMessagePath") or "/dev/termination-log")
            term_local = str(Path(tmp) / "termination-log")
            rewrite = {term_path: term_local, **mounts}

            def mapped(arg: str) -> str:
                for inside, outside in sorted(rewrite.items(), key=lambda kv: -len(kv[0])):
                    arg = arg.replace(inside, outside)
                return arg

            argv = [binary, *map(mapped, container.get("command", [])[1:])]
            argv += [mapped(str(a)) for a in container.get("args") or ()]
            env = dict(os.environ)
            for item in container.get("env") or ():
                if "value" in item:
                    env[str(item["name"])] = mapped(str(item["value"]))
            log.info(
                "running container pod=%s container=%s argv=%s",
                _ref(pod),
                container.get("name"),
                " ".join(argv),
            )
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
            )
            try:
                output, _ = await asyncio.wait_for(proc.communicate(), self.cfg.container_timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return ContainerResult(137, f"killed after {self.cfg.container_timeout_s:.0f}s")
            code = proc.returncode if proc.returncode is not None else 1
            message = ""
            with contextlib.suppress(FileNotFoundError):
                message = (
                    await asyncio.to_thread(Path(term_local).read_text, errors="replace")
                ).strip()
            tail = output.decode(errors="replace").strip().splitlines()
            if not message and code != 0 and tail:
                message = tail[-1]
            log.info(
                "container exited pod=%s container=%s code=%d message=%r",
                _ref(pod),
                container.get("name"),
                code,
                message[:300],
            )
            return ContainerResult(code if code >= 0 else 128 - code, message[:1024])

    # -- node status ----------------------------------------------------------------------

    def _capacity(self) -> dict[str, tuple[int, int]]:
        out = {}
        for resource, view in self.shim.plugins.items():
            if view.first_update is None:
                continue
            healthy = 0 if view.stream_error else len(self.shim.healthy(resource))
            out[resource] = (len(view.devices), healthy)
        return out

    async def _capacity_loop(self) -> None:
        last: dict[str, tuple[int, int]] = {}
        while True:
            current = self._capacity()
            if current != last:
                body = {
                    "status": {
                        "capacity": {r: str(total) for r, (total, _) in current.items()},
                        "allocatable": {r: str(ok) for r, (_, ok) in current.items()},
                    }
                }
                try:
                    await asyncio.to_thread(self.core.patch_node_status, self.cfg.node_name, body)
                except ApiException as exc:
                    log.warning(
                        "node status not patched node=%s reason=%r", self.cfg.node_name, str(exc)
                    )
                    await asyncio.sleep(1.0)
                    continue
                log.info(
                    "node status patched node=%s %s",
                    self.cfg.node_name,
                    " ".join(f"{r}={ok}/{t}" for r, (t, ok) in sorted(current.items())),
                )
                last = current
            await self._capacity_changed(last)

    async def _capacity_changed(self, last: dict[str, tuple[int, int]]) -> None:
        with contextlib.suppress(TimeoutError):
            await self.shim.wait_for(lambda: self._capacity() != last, 30.0)


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="lj-sandbox-kubelet",
        description="The kubelet of one KWOK node in the sandbox: device manager (device"
        " plugin API v1beta1), node capacity, pod admission with Allocate, Job Agent"
        " containers, and the read-only /pods endpoint.",
    )
    p.add_argument("--node-name", default=env("NODE_NAME"), help="the Node (env NODE_NAME)")
    p.add_argument("--plugin-dir", required=True, help="device plugin directory (kubelet.sock)")
    p.add_argument("--pods-port", type=int, required=True, help="loopback port of GET /pods")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="kubeconfig (env KUBECONFIG)")
    p.add_argument("--protocol-file", default=None, help="protocol.yaml (default built-in)")
    p.add_argument(
        "--host-path",
        action="append",
        default=[],
        metavar="HOST=LOCAL",
        help="map a pod hostPath onto a local directory (repeatable)",
    )
    p.add_argument(
        "--register-wait",
        type=float,
        default=30.0,
        help="seconds a pod waits for its device plugins to register (default 30)",
    )
    return p


def _config(args: argparse.Namespace) -> KubeletConfig:
    if not args.node_name:
        raise ConfigError("--node-name (or NODE_NAME) is required")
    if not args.kubeconfig or not Path(args.kubeconfig).is_file():
        raise ConfigError(f"--kubeconfig {args.kubeconfig!r} is not a file")
    if not 0 < args.pods_port < 65536:
        raise ConfigError(f"--pods-port {args.pods_port} is not a port")
    host_paths = {}
    for item in args.host_path:
        host, sep, local = item.partition("=")
        if not sep or not host or not local:
            raise ConfigError(f"--host-path {item!r} is not HOST=LOCAL")
        host_paths[host] = local
    try:
        protocol = load_protocol(args.protocol_file)
    except ProtocolError as exc:
        raise ConfigError(str(exc)) from None
    return KubeletConfig(
        node_name=args.node_name,
        plugin_dir=Path(args.plugin_dir),
        pods_port=args.pods_port,
        kubeconfig=args.kubeconfig,
        protocol=protocol,
        host_paths=host_paths,
        register_wait_s=args.register_wait,
    )


async def _main(cfg: KubeletConfig) -> None:
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=cfg.kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = 8
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with k8s_client.ApiClient(configuration) as api:
        await NodeKubelet(cfg, api).run(stop)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 1 on a flag mistake."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = _config(_parser().parse_args(argv))
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 1
    try:
        asyncio.run(_main(cfg))
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
