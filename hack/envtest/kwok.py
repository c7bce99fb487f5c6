"""KWOK against the envtest API server: argv, pod lifecycle stages, failure annotations.

KWOK manages only nodes annotated `kwok.x-k8s.io/node=fake` (the node factory
sets it). Its stages are in `kwok-stages.yaml` beside this module: KWOK's own
node stages (a node becomes Ready; its lease is renewed every 10 s and its
status every 10 min, see the file for why they are not left to KWOK), and these
pod stages:

- a pod bound to a fake node becomes Running;
- a Running pod owned by a Job becomes Succeeded (exit code 0);
- a Running pod annotated with FAIL_EXIT_CODE_ANNOTATION becomes Failed with
  that exit code, FAIL_REASON_ANNOTATION (default "Error") and the termination
  message FAIL_MESSAGE_ANNOTATION (default "failed by envtest"), on every
  container and in the pod status. `failure_annotations()` builds them;
- a pod being deleted is removed, unless annotated KEEP_TERMINATING_ANNOTATION
  (it stays terminating until its finalizers are removed).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_VALUE = "fake"
FAIL_EXIT_CODE_ANNOTATION = "envtest.lj-runtimekit.io/exit-code"
FAIL_REASON_ANNOTATION = "envtest.lj-runtimekit.io/reason"
FAIL_MESSAGE_ANNOTATION = "envtest.lj-runtimekit.io/message"
KEEP_TERMINATING_ANNOTATION = "envtest.lj-runtimekit.io/keep-terminating"


def failure_annotations(exit_code: int, message: str, reason: str = "Error") -> dict[str, str]:
    """Pod annotations that make KWOK fail the pod's containers as asked."""
    if not 1 <= exit_code <= 255:
        raise ValueError(f"exit code must be in 1..255 for a failure, got {exit_code}")
    if not message:
        raise ValueError("a failure needs a non-empty termination message")
    return {
        FAIL_EXIT_CODE_ANNOTATION: str(exit_code),
        FAIL_REASON_ANNOTATION: reason,
        FAIL_MESSAGE_ANNOTATION: message,
    }


def stages_text() -> str:
    """The Stage documents KWOK is started with."""
    return resources.files("lj_runtimekit.envtest").joinpath("kwok-stages.yaml").read_text()


NODE_STAGES = ("node-initialize", "node-heartbeat-with-lease")
"""Node stages every stage set keeps: without a node stage KWOK falls back to its own
defaults, with the lease-less heartbeat (see kwok-stages.yaml)."""


def stages_named(*names: str) -> str:
    """The node stages and only the named pod stages of `stages_text()`, in the file's
    order: e.g. `pod-delete` alone leaves pods bound to a fake node Pending, as a cluster
    with no kubelet does, and still removes deleted ones. ValueError names a stage the
    file lacks."""
    docs = {}
    for doc in re.split(r"^---$", stages_text(), flags=re.MULTILINE):
        parsed = yaml.safe_load(doc)
        if parsed:
            docs[parsed["metadata"]["name"]] = doc.strip("\n")
    missing = sorted(set(names) - docs.keys())
    if missing:
        raise ValueError(f"no KWOK stage {', '.join(missing)} in kwok-stages.yaml")
    kept = {*NODE_STAGES, *names}
    return "\n---\n".join(doc for name, doc in docs.items() if name in kept) + "\n"


def write_stages(path: Path, text: str | None = None) -> Path:
    """Writes the stages (`text`, default `stages_text()`) to `path` (KWOK's --config)."""
    path.write_text(stages_text() if text is None else text)
    return path


def argv(binary: Path, kubeconfig: Path, stages: Path, port: int, pod_cidr: str) -> list[str]:
    """Command line of the KWOK controller for the envtest control plane."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}={FAKE_NODE_VALUE}",
        f"--cidr={pod_cidr}",
        "--node-ip=10.127.0.1",
        f"--server-address=127.0.0.1:{port}",
        "--node-lease-duration-seconds=40",
    ]
