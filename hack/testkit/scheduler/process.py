"""lj-scheduler as a subprocess, and small helpers for tests on a real API server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from lj_runtimekit.proto.pkg.protocol import encode_inventory, load_protocol
from lj_runtimekit.testkit.scheduler.fake import nvlink_inventory

P = load_protocol()


class SchedulerProcess:
    """`python -m ...cmd.scheduler.main` with a kubeconfig; output in `log`."""

    def __init__(self, kubeconfig: str | Path, name: str, *extra: str) -> None:
        self.log = Path(tempfile.mkdtemp(prefix="ljsched")) / "scheduler.log"
        self.argv = [
            sys.executable,
            "-m",
            "lj_runtimekit.schedulerframework.cmd.scheduler.main",
            f"--kubeconfig={kubeconfig}",
            f"--scheduler-name={name}",
            "--metrics-port=0",
            "--log-format=text",
            *extra,
        ]
        if not any(a.startswith("--leader-elect") for a in extra):
            self.argv.append("--leader-elect=false")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SchedulerProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out, env=dict(os.environ))
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def pod_manifest(
    name: str, scheduler_name: str, selector: dict[str, str], limits: dict[str, str], **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": extra.pop("annotations", {})},
        "spec": {
            "schedulerName": scheduler_name,
            "runtimeClassName": extra.pop("runtime_class", "lj-runtime"),
            "nodeSelector": selector,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
            **extra,
        },
    }


def annotate_inventory(core: k8s_client.CoreV1Api, node: str) -> None:
    """Publishes an 8-GPU, two-NVLink-island inventory on the node, as a Device Plugin would."""
    text = encode_inventory(nvlink_inventory(node))
    core.patch_node(node, {"metadata": {"annotations": {P.annotations.node_devices: text}}})


def bound_pods(core: k8s_client.CoreV1Api, ns: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(ns).items if p.spec.node_name}


def pod_events(core: k8s_client.CoreV1Api, ns: str, name: str) -> list[str]:
    return [
        f"{e.reason}: {e.message}"
        for e in core.list_namespaced_event(ns).items
        if e.involved_object.name == name
    ]
