"""In-memory cluster double for scheduler tests.

`FakeCluster` plays the API server for pure-logic tests: it holds Node and Pod
objects as the API server would send them, feeds them to a Scheduler through
the same informer handlers, and binds like the API server does (the
Binding's annotations are copied onto the pod). `restart()` builds a fresh
Scheduler from the stored objects only, as a restarted process would.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from lj_runtimekit.proto.pkg.protocol import (
    BIND_PHASE_ALLOCATED,
    DeviceLink,
    NodeDevice,
    encode_inventory,
    load_protocol,
)
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.config.config import Config, parse_config
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    Status,
)
from lj_runtimekit.schedulerframework.internal.scheduler.scheduler import Scheduler

PROTOCOL = load_protocol()
GPU = PROTOCOL.resources.gpu
CORE = PROTOCOL.resources.core
MEM = PROTOCOL.resources.memory


def nvlink_inventory(
    node: str, count: int = 8, groups: int = 2, mig: Mapping[int, list[str]] | None = None
) -> tuple[NodeDevice, ...]:
    """`count` GPUs in `groups` NVLink islands (PCIe between islands), NUMA = island."""
    per = count // groups
    ids = [f"{node}-gpu{i}" for i in range(count)]
    out = []
    for i in range(count):
        island = i // per
        links = tuple(
            DeviceLink(
                ids[j],
                "nvlink" if j // per == island else "pcie",
                600 if j // per == island else 32,
            )
            for j in range(count)
            if j != i
        )
        profiles = (mig or {}).get(i)
        if profiles:
            from lj_runtimekit.proto.pkg.protocol import MigSlot

            out.append(
                NodeDevice(
                    ids[i],
                    i,
                    mode="mig",
                    numa=island,
                    mig=tuple(MigSlot(f"{ids[i]}-mig{k}", p) for k, p in enumerate(profiles)),
                )
            )
        else:
            out.append(NodeDevice(ids[i], i, numa=island, links=links))
    return tuple(out)


def preferred_affinity(*terms: tuple[int, str, str]) -> dict[str, Any]:
    """A pod's `affinity` with preferred node affinity: (weight, label key, value) per term."""
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": weight,
                    "preference": {
                        "matchExpressions": [{"key": key, "operator": "In", "values": [value]}]
                    },
                }
                for weight, key, value in terms
            ]
        }
    }


class FakeCluster:
    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config: Config = parse_config(dict(config or {}), "<test>")
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self._uid = itertools.count(1)
        self.fail_binds = 0
        self.admit = True
        """Play the node's kubelet and Device Plugin: a bound device pod is admitted at once
        (bind phase allocated, Running). False leaves bound pods in admission."""
        self.scheduler = self._new_scheduler()

    def _new_scheduler(self) -> Scheduler:
        s = Scheduler(self.config, PROTOCOL, None)
        s.bind_pod = self._bind  # type: ignore[method-assign,assignment]
        return s

    # -- API server ---------------------------------------------------------------------------

    def _bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> Status:
        from lj_runtimekit.schedulerframework.internal.framework.types import error

        obj = self.pods.get(pod.uid)
        if obj is None:
            return error("not found")
        if obj["spec"].get("nodeName"):
            return error(f"pod {pod.key} is already assigned to node {obj['spec']['nodeName']}")
        if obj["metadata"].get("deletionTimestamp"):
            return error(
                f'Operation cannot be fulfilled on pods/binding "{pod.name}": pod {pod.name} is '
                "being deleted, cannot be assigned to a host"
            )
        if self.fail_binds > 0:
            self.fail_binds -= 1
            return error("injected bind failure")
        obj["spec"]["nodeName"] = node
        obj["metadata"].setdefault("annotations", {}).update(annotations)
        self.scheduler.on_pod("MODIFIED", copy.deepcopy(obj))
        if self.admit:
            self.admit_pod(pod.uid)
        return SUCCESS

    def admit_pod(self, uid: str, phase: str = "Running") -> None:
        """The node admits a bound pod: the Device Plugin's record, then the kubelet's phase."""
        obj = self.pods[uid]
        a = PROTOCOL.annotations
        if phase == "Running" and a.assigned_devices in obj["metadata"]["annotations"]:
            obj["metadata"]["annotations"][a.bind_phase] = BIND_PHASE_ALLOCATED
        obj["status"]["phase"] = phase
        self.scheduler.on_pod("MODIFIED", copy.deepcopy(obj))

    def add_node(
        self,
        name: str,
        gpus: int = 8,
        inventory: tuple[NodeDevice, ...] | None = None,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        unschedulable: bool = False,
        extra: Mapping[str, str] | None = None,
        cpu: str = "96",
        pods: str = "110",
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        alloc = {"cpu": cpu, "memory": "768Gi", "pods": pods}
        if gpus:
            alloc.update({GPU: str(gpus), CORE: str(100 * gpus), MEM: str(100 * gpus)})
        alloc.update(extra or {})
        ann = dict(annotations or {})
        if inventory is not None:
            ann[PROTOCOL.annotations.node_devices] = encode_inventory(inventory)
        obj = {
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": ann},
            "spec": {"taints": taints or [], "unschedulable": unschedulable},
            "status": {"allocatable": alloc, "capacity": alloc},
        }
        self.nodes[name] = obj
        self.scheduler.on_node("ADDED", copy.deepcopy(obj))

    def add_pod(
        self,
        name: str,
        containers: list[Mapping[str, str]] | Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        scheduler_name: str = "lj-scheduler",
        runtime_class: str | None = "lj-runtime",
        init: list[Mapping[str, str]] | None = None,
        labels: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> str:
        uid = f"uid-{next(self._uid)}"
        if containers is None or isinstance(containers, Mapping):
            containers = [containers or {}]
        obj: dict[str, Any] = {
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": uid,
                "annotations": dict(annotations or {}),
                "labels": dict(labels or {}),
            },
            "spec": {
                "schedulerName": scheduler_name,
                "containers": [
                    {"name": f"c{i}", "resources": {"limits": dict(c)}}
                    for i, c in enumerate(containers)
                ],
                **spec,
            },
            "status": {"phase": "Pending"},
        }
        if init:
            obj["spec"]["initContainers"] = [
                {"name": f"init{i}", "resources": {"limits": dict(c)}} for i, c in enumerate(init)
            ]
        if runtime_class:
            obj["spec"]["runtimeClassName"] = runtime_class
        self.pods[uid] = obj
        self.scheduler.on_pod("ADDED", copy.deepcopy(obj))
        return uid

    def add_bound_pod(self, name: str, node: str, assignment: str, gpus: int) -> str:
        """A pod already running on `node` with devices recorded by its annotation."""
        uid = self.add_pod(name, {GPU: str(gpus)}, scheduler_name="someone-else")
        obj = self.pods[uid]
        obj["spec"]["nodeName"] = node
        obj["status"]["phase"] = "Running"
        obj["metadata"]["annotations"][PROTOCOL.annotations.assigned_devices] = assignment
        self.scheduler.on_pod("MODIFIED", copy.deepcopy(obj))
        return uid

    def update_pod_spec(self, uid: str, **spec: Any) -> None:
        """Changes fields of the pod's spec (None removes one), as an update would."""
        obj = self.pods[uid]
        for key, value in spec.items():
            if value is None:
                obj["spec"].pop(key, None)
            else:
                obj["spec"][key] = value
        self.scheduler.on_pod("MODIFIED", copy.deepcopy(obj))

    def terminate_pod(self, uid: str) -> None:
        """The pod is being deleted (its grace period runs): the deletion timestamp is set."""
        obj = self.pods[uid]
        obj["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        self.scheduler.on_pod("MODIFIED", copy.deepcopy(obj))

    def delete_pod(self, uid: str) -> None:
        obj = self.pods.pop(uid)
        self.scheduler.on_pod("DELETED", obj)

    # -- driving -----------------------------------------------------------------------------

    def schedule(self, max_cycles: int = 10000, wait_binds: bool = True) -> int:
        """Runs scheduling cycles until the active queue is empty; waits for the binds
        (`wait_binds=False`: bindings may stay queued behind a pod in admission)."""
        n = 0
        while n < max_cycles:
            qp = self.scheduler.queue.pop(timeout_s=0)
            if qp is None:
                break
            self.scheduler.schedule_one(qp)
            n += 1
            if wait_binds:
                self.scheduler.wait_binds()
        assert not wait_binds or self.scheduler.wait_binds()
        return n

    def restart(self) -> None:
        """A new scheduler process: state rebuilt from the objects (list, then watch)."""
        self.scheduler.stop()
        self.scheduler = self._new_scheduler()
        for obj in self.nodes.values():
            self.scheduler.on_node("ADDED", copy.deepcopy(obj))
        for obj in self.pods.values():
            self.scheduler.on_pod("ADDED", copy.deepcopy(obj))

    def node_of(self, uid: str) -> str:
        return str(self.pods[uid]["spec"].get("nodeName") or "")

    def assignment(self, uid: str) -> str:
        return str(
            self.pods[uid]["metadata"]["annotations"].get(PROTOCOL.annotations.assigned_devices, "")
        )

    def events(self, uid: str, reason: str | None = None) -> list[str]:
        return [
            e.message
            for e in self.scheduler.recorder.recorded
            if e.uid == uid and (reason is None or e.reason == reason)
        ]
