"""The ledger: container key -> what the container holds and what the kubelet asked for.

It is rebuilt at start from the Runtime's allocations and the pods'
`annotations.allocated_devices` records, so a restart of the plugin never
hands out an assignment twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from lj_runtimekit.deviceplugin.internal.allocate.resolve import DoneKey
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import ContainerInfo, PodInfo
from lj_runtimekit.deviceplugin.internal.rm.manager import ResourceManager
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import (
    AssignmentError,
    DeviceShare,
    Protocol,
    decode_assignment,
)
from lj_runtimekit.proto.pkg.protocol.assignment import foreign_assignment
from lj_runtimekit.proto.pkg.runtimeclient import from_request, normalize

log = logging.getLogger(__name__)


@dataclass
class Held:
    """One container's allocation as the plugin knows it."""

    key: str
    pod_uid: str
    namespace: str
    name: str
    container: str
    shares: tuple[DeviceShare, ...]
    called: set[str] = field(default_factory=set)
    """Resources the kubelet already asked for (all implied ones after a rebuild)."""
    init: bool = False
    """A run-to-completion init container (its devices go to the app containers again)."""
    sidecar: bool = False
    missing_since: float | None = None
    units: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The slice unit IDs the kubelet passed to Allocate, per resource (none after a
    rebuild)."""


def describe(shares: Iterable[DeviceShare]) -> str:
    """Shares as text for messages and logs."""
    parts = [
        s.device_id
        if s.whole
        else f"{s.device_id}({s.core_percent}% core, {s.memory_percent}% memory)"
        for s in shares
    ]
    return ", ".join(parts) or "no device"


class Ledger:
    """What every container of the node holds, as the plugin served it."""

    def __init__(self, rm: ResourceManager, protocol: Protocol) -> None:
        self._rm = rm
        self._protocol = protocol
        self.entries: dict[str, Held] = {}
        self._whole_of: tuple[object, dict[str, str]] = (None, {})
        """(snapshot, device or MIG instance ID -> resource) of the last snapshot."""

    def resource_of(self, share: DeviceShare) -> set[str]:
        """The resources a share stands for (a slice: core and memory)."""
        res = self._protocol.resources
        if not share.whole:
            return {res.core, res.memory}
        snapshot = self._rm.snapshot
        if self._whole_of[0] is not snapshot:
            table = {
                d.id: kind.resource(res)
                for d in snapshot.devices
                if (kind := devicekind.by_value(d.kind)) is not None
            }
            for d in snapshot.devices:
                table.update({m.id: res.mig(m.profile) for m in d.mig_instances})
            self._whole_of = (snapshot, table)
        return {self._whole_of[1].get(share.device_id, res.gpu)}

    def implied(self, shares: Iterable[DeviceShare]) -> set[str]:
        """The resources a set of shares stands for."""
        out: set[str] = set()
        for share in shares:
            out |= self.resource_of(share)
        return out

    def rebuild(self, allocations: Iterable[rpb.Allocation], pods: Iterable[PodInfo]) -> None:
        """Start over from the Runtime's allocations, then the pods' records of allocations
        the Runtime lacks (every implied resource counts as asked for); a record copied with
        another pod's assignment (`foreign_assignment`) is not the pod's."""
        self.entries.clear()
        for a in allocations:
            shares = tuple(from_request(d) for d in a.devices)
            self.entries[a.container_key] = Held(
                a.container_key,
                a.pod_uid,
                a.pod_namespace,
                a.pod_name,
                a.container_name,
                shares,
                self.implied(shares),
                init=a.init_container,
            )
        key = self._protocol.annotations.allocated_devices
        for pod in pods:
            text = pod.annotations.get(key)
            if text is None or foreign_assignment(pod.annotations, pod.uid) is not None:
                continue
            try:
                record = decode_assignment(text)
            except AssignmentError as exc:
                log.warning(
                    "pod record unreadable",
                    extra={"pod": pod.ref, "annotation": key, "reason": str(exc)},
                )
                continue
            for container, shares in record.items():
                ckey = f"{pod.uid}/{container}"
                if ckey not in self.entries:
                    log.warning(
                        "pod records an allocation the Runtime lacks",
                        extra={"pod": pod.ref, "container": container},
                    )
                    norm = tuple(normalize(s) for s in shares)
                    self.entries[ckey] = Held(
                        ckey, pod.uid, pod.namespace, pod.name, container, norm, self.implied(norm)
                    )

    def done(self) -> set[DoneKey]:
        """(pod uid, container, resource) of every call the kubelet already made."""
        return {(h.pod_uid, h.container, r) for h in self.entries.values() for r in h.called}

    def of_pod(self, uid: str) -> dict[str, Held]:
        """Container name -> what it holds, for one pod."""
        return {h.container: h for h in self.entries.values() if h.pod_uid == uid}

    def busy(self) -> dict[str, list[str]]:
        """Device ID -> container keys holding any share of it."""
        busy: dict[str, list[str]] = {}
        for held in self.entries.values():
            for share in held.shares:
                busy.setdefault(share.device_id, []).append(held.key)
        return busy

    def held_units(self, resource: str) -> set[str]:
        """Slice units of `resource` the kubelet passed for containers the plugin holds."""
        return {u for held in self.entries.values() for u in held.units.get(resource, ())}

    def clash_set(self, pod: PodInfo, container: ContainerInfo) -> set[str]:
        """Devices of the pod the container must not get: those of containers that run beside
        it (app containers and sidecars for an app container or sidecar; sidecars for an init
        container). The kubelet hands init containers' devices to the app containers again."""
        out: set[str] = set()
        for held in self.entries.values():
            if held.pod_uid != pod.uid or held.container == container.name:
                continue
            if held.sidecar or (not container.run_to_completion and not held.init):
                out |= {s.device_id for s in held.shares if s.whole}
        return out

    def missing(self) -> bool:
        """Whether a holder has left the kubelet's pod list (release grace running)."""
        return any(h.missing_since is not None for h in self.entries.values())

    def holders(self, pods: Sequence[PodInfo]) -> list[PodInfo]:
        """The pods among `pods` that hold devices."""
        uids = {h.pod_uid for h in self.entries.values()}
        return [p for p in pods if p.uid in uids]
