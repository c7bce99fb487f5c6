"""The enable/disable Job of one node: deterministic name, labels, least-privilege pod.

Pinning: a required node affinity on the field `metadata.name` (what the
DaemonSet controller does), not `nodeName`: the pod still goes through the
scheduler, so resources, taints and readiness are checked and a pending pod
has a scheduler event saying why. The pod tolerates exactly the node's taints
as they are when the Job is created.
"""

from __future__ import annotations

import hashlib
from typing import Any

from lj_runtimekit.controller.internal.config.config import JobSettings
from lj_runtimekit.controller.internal.nodestate.state import PREFIX, Action

MANAGED_BY = "lj-runtimekit-controller"
APP_NAME = "lj-runtimekit-job-agent"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
NAME_LABEL = "app.kubernetes.io/name"
ACTION_LABEL = f"{PREFIX}/action"
NODE_HASH_LABEL = f"{PREFIX}/node-hash"
NODE_LABEL = f"{PREFIX}/node"
NODE_ANNOTATION = f"{PREFIX}/node"
RECORDED_ANNOTATION = f"{PREFIX}/recorded"
CONTAINER = "agent"
SOCKET_VOLUME = "runtime-sockets"
JOB_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
"""Server-side selector of the Job watch."""

# Agent exit codes that retrying cannot fix (usage, Runtime too old, Runtime refused,
# internal error): the Job fails at once instead of spending its backoffLimit.
PERMANENT_EXIT_CODES = [1, 2, 4, 5]


def node_hash(node: str) -> str:
    """16 hex digits of SHA-256 of the node name (names may be 253 characters)."""
    return hashlib.sha256(node.encode()).hexdigest()[:16]


def job_name(action: Action, node: str) -> str:
    """`lj-runtimekit-<action>-<node-hash>`: the same node and action always give the same
    name, so a re-run (restart, retry) can never create a second Job."""
    return f"lj-runtimekit-{action}-{node_hash(node)}"


def node_selector(node: str) -> str:
    """Label selector of every Job of `node`."""
    return f"{JOB_SELECTOR},{NODE_HASH_LABEL}={node_hash(node)}"


def labels(action: Action, node: str) -> dict[str, str]:
    """Labels identifying node and action (the node name only when it fits a label)."""
    out = {
        NAME_LABEL: APP_NAME,
        MANAGED_BY_LABEL: MANAGED_BY,
        ACTION_LABEL: action,
        NODE_HASH_LABEL: node_hash(node),
    }
    if len(node) <= 63:
        out[NODE_LABEL] = node
    return out


def tolerations(taints: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """One toleration per taint of the node (the same key, value and effect)."""
    out: list[dict[str, Any]] = []
    for taint in taints or []:
        key, effect, value = taint.get("key"), taint.get("effect"), taint.get("value")
        toleration: dict[str, Any] = {"key": key, "effect": effect}
        if value:
            toleration.update(operator="Equal", value=value)
        else:
            toleration["operator"] = "Exists"
        out.append(toleration)
    return out


def build(
    settings: JobSettings,
    action: Action,
    node_name: str,
    node_uid: str,
    taints: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The Job manifest for `action` on the node."""
    name = job_name(action, node_name)
    job_labels = labels(action, node_name)
    non_root = settings.run_as_user != 0
    container_security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_group,
        "runAsNonRoot": non_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node_name]}
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": tolerations(taints),
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": CONTAINER,
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": ["lj-job-agent"],
                "args": [
                    action,
                    f"--socket-dir={settings.socket_dir}",
                    f"--requester={settings.namespace}/{name}",
                    f"--retry-timeout={settings.agent_retry_timeout_s}",
                    "--termination-log=/dev/termination-log",
                    "--log-format=json",
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": {
                    "requests": {"cpu": "10m", "memory": "32Mi"},
                    "limits": {"memory": "128Mi"},
                },
                "securityContext": container_security,
                "volumeMounts": [
                    {"name": SOCKET_VOLUME, "mountPath": settings.socket_dir, "readOnly": True}
                ],
            }
        ],
        "volumes": [
            {
                "name": SOCKET_VOLUME,
                "hostPath": {"path": settings.socket_dir, "type": "Directory"},
            }
        ],
    }
    if settings.priority_class:
        pod_spec["priorityClassName"] = settings.priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": job_labels,
            "annotations": {NODE_ANNOTATION: node_name},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node_uid,
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "backoffLimit": settings.backoff_limit,
            "activeDeadlineSeconds": settings.active_deadline_s,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER,
                            "operator": "In",
                            "values": PERMANENT_EXIT_CODES,
                        },
                    },
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget"}],
                    },
                ]
            },
            "template": {
                "metadata": {
                    "labels": job_labels,
                    "annotations": {NODE_ANNOTATION: node_name, **settings.pod_annotations},
                },
                "spec": pod_spec,
            },
        },
    }
