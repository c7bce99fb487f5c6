"""Node labels: device kind, model, count, mode and Runtime version (keys from the protocol).

The scheduler filters nodes and gates features on these. Values follow the
label value syntax (at most 63 characters of alphanumerics, `-`, `_`, `.`).
A node with devices of several kinds, models or modes is labelled `mixed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from lj_runtimekit.proto.pkg.kube import (
    STRATEGIC_MERGE_PATCH,
    KubeClient,
    KubeError,
    RetryPolicy,
    call_async,
)

if TYPE_CHECKING:
    from lj_runtimekit.deviceplugin.internal.rm.manager import Snapshot

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import DeviceLink, MigSlot, NodeDevice, Protocol
from lj_runtimekit.proto.pkg.protocol.inventory import DeviceModeName, encode_inventory

log = logging.getLogger(__name__)

_MODES = {
    rpb.DEVICE_MODE_EXCLUSIVE: "exclusive",
    rpb.DEVICE_MODE_TDM: "tdm",
    rpb.DEVICE_MODE_MIG: "mig",
}
MIXED = "mixed"


def label_value(text: str) -> str:
    """`text` made a valid label value (invalid characters become `-`, trimmed to 63)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return value.strip("-_.")


def _one(values: Iterable[str]) -> str:
    distinct = sorted(set(values))
    if not distinct:
        return ""
    return distinct[0] if len(distinct) == 1 else MIXED


def node_labels(
    devices: Iterable[rpb.Device], runtime_version: str, protocol: Protocol
) -> dict[str, str | None]:
    """The labels for a node's devices; None removes a label that no longer applies."""
    devs = list(devices)
    keys = protocol.labels
    kind = _one(devicekind.name_of(d.kind) for d in devs)
    model = _one(label_value(d.model) for d in devs if d.model)
    mode = _one(_MODES.get(d.mode, "unknown") for d in devs)
    return {
        keys.device_kind: kind or None,
        keys.device_model: model or None,
        keys.device_count: str(len(devs)),
        keys.device_mode: mode or None,
        keys.runtime_version: label_value(runtime_version) or None,
    }


def node_inventory(devices: Iterable[rpb.Device], runtime_up: bool = True) -> str:
    """The node device inventory annotation value (the scheduler places pods on these ids).
    A device of a kind the device-kind table does not know is left out (never placed)."""
    modes: dict[int, DeviceModeName] = {
        rpb.DEVICE_MODE_EXCLUSIVE: "exclusive",
        rpb.DEVICE_MODE_MIG: "mig",
    }
    return encode_inventory(
        NodeDevice(
            id=d.id,
            index=d.index,
            kind=devicekind.name_of(d.kind),
            mode=modes.get(d.mode, "tdm"),
            numa=d.numa_node,
            healthy=runtime_up and d.health == rpb.HEALTH_HEALTHY,
            links=tuple(
                DeviceLink(
                    p.peer_id,
                    "nvlink" if p.kind == rpb.INTERCONNECT_KIND_NVLINK else "pcie",
                    p.bandwidth_gbps,
                )
                for p in d.peers
            ),
            mig=tuple(MigSlot(m.id, m.profile) for m in d.mig_instances),
        )
        for d in devices
        if devicekind.by_value(d.kind) is not None
    )


class NodeLabeller:
    """Patches the labels onto the Node when they change."""

    def __init__(self, kube: KubeClient, node_name: str, attempts: int = 5) -> None:
        self._kube = kube
        self.node_name = node_name
        self._retry = RetryPolicy(attempts=attempts, timeout_s=None, max_backoff_s=5.0)
        self._applied: Mapping[str, str | None] | None = None

    async def follow(
        self,
        snapshots: asyncio.Queue[Snapshot],
        first: Snapshot,
        protocol: Protocol,
        admission: str,
        retry_max_s: float = 30.0,
    ) -> None:
        """Keep the node's labels, inventory annotation and admission mode (`admission`,
        the value of `annotations.node_admission`) written for the newest snapshot:
        a refused write is retried with exponential backoff (capped at `retry_max_s`) until
        it lands or a newer snapshot replaces it. Runs until cancelled."""
        snap = first
        delay = 0.2
        inventory_key = protocol.annotations.node_devices
        while True:
            written = await self.apply(
                node_labels(snap.devices, snap.runtime_version, protocol),
                {
                    inventory_key: node_inventory(snap.devices, snap.runtime_up),
                    protocol.annotations.node_admission: admission,
                },
            )
            if written:
                delay = 0.2
                snap = await snapshots.get()
                continue
            with contextlib.suppress(TimeoutError):
                snap = await asyncio.wait_for(snapshots.get(), delay)
            delay = min(delay * 2, retry_max_s)

    async def apply(
        self, labels: Mapping[str, str | None], annotations: Mapping[str, str] | None = None
    ) -> bool:
        """Patch `labels` (and `annotations`) when they differ from the last applied; False
        when the API refused."""
        wanted = {**labels, **{f"annotation:{k}": v for k, v in (annotations or {}).items()}}
        if wanted == self._applied:
            return True
        meta: dict[str, object] = {"labels": dict(labels)}
        if annotations:
            meta["annotations"] = dict(annotations)
        try:
            await call_async(
                f"label node {self.node_name}",
                functools.partial(
                    self._kube.request,
                    "PATCH",
                    f"/api/v1/nodes/{self.node_name}",
                    {"metadata": meta},
                    content_type=STRATEGIC_MERGE_PATCH,
                ),
                self._retry,
            )
        except KubeError as exc:
            log.warning(
                "node labels not written", extra={"node": self.node_name, "reason": str(exc)}
            )
            return False
        self._applied = wanted
        log.info(
            "node labelled",
            extra={
                "node": self.node_name,
                "labels": ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if v is not None),
            },
        )
        return True
