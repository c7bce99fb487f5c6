"""Metric families of one collection: devices, MIG instances, containers, allocation.

Every name carries the one prefix `lj_runtimekit_`, values are in base units
(bytes, seconds, joules, watts, degrees Celsius, ratios 0-1) named by the
name's last word, which OpenMetrics also serves as the family's unit, and
counters end in `_total`. Families are built once per collection; a scrape only yields them.
While the Runtime is down the device, MIG and container families are absent
(not stale-marked): Prometheus then ends those series itself at the next
scrape, and `lj_runtimekit_runtime_up` is 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from lj_runtimekit.exporter.internal.allocation.assignments import (
    WHOLE_PERCENT,
    Allocations,
    share_percents,
)
from lj_runtimekit.exporter.internal.metrics.labels import LabelConfig
from lj_runtimekit.exporter.internal.metrics.view import RuntimeView
from lj_runtimekit.exporter.internal.metrics.xid import XidCodes
from lj_runtimekit.exporter.internal.pods.model import PodView
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import Resources

PREFIX = "lj_runtimekit_"
MIG_COMPUTE_SLICES = 7
"""Compute slices of a whole MIG-capable GPU (the `7g` of a full-GPU profile)."""

DEVICE_LABELS = ("node", "device", "uuid", "model", "kind")
MIG_LABELS = (*DEVICE_LABELS, "mig_profile", "mig_instance_id")
CONTAINER_LABELS = (
    "node",
    "namespace",
    "pod",
    "container",
    "device",
    "uuid",
    "mig_profile",
    "mig_instance_id",
)
MODES = ("exclusive", "tdm", "mig")
CLAIM = "claim"
"""The first part of a DRA claim allocation's container_key, `claim/<claim uid>`."""
UNITS = ("bytes", "seconds", "ratio", "celsius", "watts", "joules")
"""Base units a family name may end in: OpenMetrics serves it as the family's `# UNIT`."""


def unit_of(name: str) -> str:
    """The unit a family name (without `_total`) ends in, else empty."""
    suffix = name.rpartition("_")[2]
    return suffix if suffix in UNITS else ""


def mode_name(mode: int) -> str:
    """`exclusive`, `tdm`, `mig` or `unspecified`."""
    return pb.DeviceMode.Name(mode).removeprefix("DEVICE_MODE_").lower()  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Place:
    """Where a device ID lives: the device, and the MIG instance when it is one."""

    device: pb.Device
    instance: pb.MigInstance | None


def _gauge(name: str, doc: str, labels: Iterable[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels), unit=unit_of(name))


def _counter(name: str, doc: str, labels: Iterable[str]) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=list(labels), unit=unit_of(name))


def whole_resource(resources: Resources, kind: int) -> str:
    """The extended resource that offers a whole device of this kind (protocol constants);
    empty for a kind the device-kind table does not know (not offered)."""
    known = devicekind.by_value(kind)
    return known.resource(resources) if known else ""


def build_families(
    node: str,
    resources: Resources,
    runtime: RuntimeView | None,
    pods: PodView | None,
    allocations: Allocations | None,
    xids: XidCodes,
    label_config: LabelConfig,
) -> list[Metric]:
    """The device, MIG, container and allocation families of one collection (`xids` splits
    the devices' XID counters by code across collections; `label_config` names the labels)."""
    if runtime is None:
        return []
    names = label_config.names
    device_names = names(DEVICE_LABELS)
    mig_names = names(MIG_LABELS)
    families: list[Metric] = []
    places: dict[str, _Place] = {}
    device_labels: dict[str, list[str]] = {}

    info = _gauge(
        "device_info",
        "Static facts of a device (value 1): PCI bus id, NUMA node, and the extended resource"
        " that offers it whole.",
        names((*DEVICE_LABELS, "pci_bus_id", "numa_node", "resource")),
    )
    util = _gauge(
        "device_utilization_ratio", "Compute utilization of the device, 0-1.", device_names
    )
    mem_used = _gauge("device_memory_used_bytes", "Device memory in use.", device_names)
    mem_total = _gauge("device_memory_total_bytes", "Total device memory.", device_names)
    temp = _gauge("device_temperature_celsius", "Device temperature.", device_names)
    power = _gauge("device_power_watts", "Device power draw.", device_names)
    energy = _counter(
        "device_energy_joules",
        "Energy the device consumed since the Runtime started.",
        device_names,
    )
    ecc = _counter(
        "device_ecc_errors",
        "ECC errors since the Runtime started, by type (corrected, uncorrected).",
        names((*DEVICE_LABELS, "type")),
    )
    xid = _counter(
        "device_xid_errors",
        "XID errors since the Runtime started, by XID code (the code the device's health reason"
        " named when the count rose; empty when it named none).",
        names((*DEVICE_LABELS, "xid")),
    )
    healthy = _gauge(
        "device_healthy", "1 when the Runtime reports the device healthy, else 0.", device_names
    )
    mode = _gauge(
        "device_mode",
        "Sharing mode of the device: 1 for the current mode (exclusive, tdm, mig), 0 otherwise.",
        names((*DEVICE_LABELS, "mode")),
    )
    mig_util = _gauge(
        "mig_utilization_ratio", "Compute utilization of the MIG instance, 0-1.", mig_names
    )
    mig_used = _gauge("mig_memory_used_bytes", "MIG instance memory in use.", mig_names)
    mig_total = _gauge("mig_memory_total_bytes", "Total memory of the MIG instance.", mig_names)
    mig_healthy = _gauge(
        "mig_healthy", "1 when the Runtime reports the MIG instance healthy, else 0.", mig_names
    )
    mig_info = _gauge(
        "mig_info",
        "Static facts of a MIG instance (value 1): its own ID and the extended resource that"
        " offers its profile.",
        names((*MIG_LABELS, "mig_uuid", "resource")),
    )
    families += [info, util, mem_used, mem_total, temp, power, energy, ecc, xid, healthy, mode]
    families += [mig_info, mig_util, mig_used, mig_total, mig_healthy]
    mig_labels: dict[str, list[str]] = {}

    for device in runtime.devices:
        labels = [
            node,
            str(device.index),
            device.id,
            device.model,
            devicekind.name_of(device.kind),
        ]
        device_labels[device.id] = labels
        places[device.id] = _Place(device, None)
        info.add_metric(
            [
                *labels,
                device.pci_bus_id,
                str(device.numa_node),
                whole_resource(resources, device.kind),
            ],
            1,
        )
        mem_total.add_metric(labels, float(device.memory_bytes))
        healthy.add_metric(labels, 1.0 if device.health == pb.HEALTH_HEALTHY else 0.0)
        current = mode_name(device.mode)
        for name in MODES:
            mode.add_metric([*labels, name], 1.0 if name == current else 0.0)
        for instance in device.mig_instances:
            places[instance.id] = _Place(device, instance)
            ilabels = [*labels, instance.profile, str(instance.instance_id)]
            mig_labels[instance.id] = ilabels
            mig_info.add_metric([*ilabels, instance.id, resources.mig(instance.profile)], 1)
            mig_total.add_metric(ilabels, float(instance.memory_bytes))
            mig_healthy.add_metric(ilabels, 1.0 if instance.health == pb.HEALTH_HEALTHY else 0.0)
        sample = runtime.device_metrics.get(device.id)
        if sample is None:
            continue
        util.add_metric(labels, sample.utilization_ratio)
        mem_used.add_metric(labels, float(sample.memory_used_bytes))
        temp.add_metric(labels, sample.temperature_celsius)
        power.add_metric(labels, sample.power_watts)
        energy.add_metric(labels, sample.energy_joules)
        ecc.add_metric([*labels, "corrected"], float(sample.ecc_corrected_errors))
        ecc.add_metric([*labels, "uncorrected"], float(sample.ecc_uncorrected_errors))
        by_code = xids.update(device.id, sample.xid_errors, device.health_reason)
        for code in sorted(by_code, key=lambda c: (len(c), c)):
            xid.add_metric([*labels, code], float(by_code[code]))
        for mig in sample.mig_instances:
            ilabels_or_none = mig_labels.get(mig.instance_id)
            if ilabels_or_none is None:
                continue
            mig_util.add_metric(ilabels_or_none, mig.utilization_ratio)
            mig_used.add_metric(ilabels_or_none, float(mig.memory_used_bytes))

    if pods is not None and allocations is not None:
        families += _allocation_families(
            runtime, device_labels, mig_labels, allocations, device_names, mig_names
        )
    families += _container_families(node, runtime, places, pods, allocations, label_config)
    return families


def _allocation_families(
    runtime: RuntimeView,
    device_labels: dict[str, list[str]],
    mig_labels: dict[str, list[str]],
    allocations: Allocations,
    device_names: list[str],
    mig_names: list[str],
) -> list[Metric]:
    core = _gauge(
        "device_core_allocated_ratio",
        "Share of the device's compute allocated to containers (pod annotations) and DRA"
        " claims (each claim once), 0-1;"
        " above 1 means over-committed.",
        device_names,
    )
    memory = _gauge(
        "device_memory_allocated_ratio",
        "Share of the device's memory allocated to containers (pod annotations) and DRA"
        " claims (each claim once), 0-1;"
        " above 1 means over-committed.",
        device_names,
    )
    containers = _gauge(
        "device_allocated_containers",
        "Containers holding the device, a slice of it or one of its MIG instances.",
        device_names,
    )
    mig_containers = _gauge(
        "mig_allocated_containers", "Containers holding the MIG instance.", mig_names
    )
    by_device = allocations.by_device
    for device in runtime.devices:
        labels = device_labels[device.id]
        own = by_device.get(device.id)
        core_ratio = own.core_percent / WHOLE_PERCENT if own else 0.0
        memory_ratio = own.memory_percent / WHOLE_PERCENT if own else 0.0
        count = own.containers if own else 0
        for instance in device.mig_instances:
            held = by_device.get(instance.id)
            mig_containers.add_metric(mig_labels[instance.id], held.containers if held else 0)
            if held is None:  # held by a pod, or by a DRA claim no running container uses yet
                continue
            count += held.containers
            core_ratio += instance.compute_slices / MIG_COMPUTE_SLICES
            if device.memory_bytes:
                memory_ratio += instance.memory_bytes / device.memory_bytes
        core.add_metric(labels, round(core_ratio, 6))
        memory.add_metric(labels, round(memory_ratio, 6))
        containers.add_metric(labels, count)
    return [core, memory, containers, mig_containers]


def _container_families(
    node: str,
    runtime: RuntimeView,
    places: dict[str, _Place],
    pods: PodView | None,
    allocations: Allocations | None,
    label_config: LabelConfig,
) -> list[Metric]:
    """Per-container usage (Runtime) and allocation (annotations, DRA claims) of pods the node
    still runs. A DRA claim's usage is the claim's, given to every container sharing it (so
    summing container series over a shared claim counts it once per container; the device
    series count it once).

    Pod labels come from the pods view: without it (kubelet and fallback down)
    no container series is exported, and a container whose pod is gone from
    the view has no series even if the Runtime still reports it.
    """
    if pods is None:
        return []
    container_names = [*label_config.names(CONTAINER_LABELS), *label_config.pod_label_names()]
    util = _gauge(
        "container_utilization_ratio",
        "Share of the compute the container uses, 0-1, relative to what it holds: the device,"
        " or for a MIG instance (mig_profile and mig_instance_id set) that instance.",
        container_names,
    )
    mem = _gauge(
        "container_memory_used_bytes", "Device memory the container uses.", container_names
    )
    core_alloc = _gauge(
        "container_core_allocated_ratio",
        "Share of the compute allocated to the container, 0-1, relative to what it holds: the"
        " device, or for a MIG instance (mig_profile and mig_instance_id set) that instance"
        " (1 for a whole device or instance).",
        container_names,
    )
    mem_alloc = _gauge(
        "container_memory_allocated_ratio",
        "Share of the memory allocated to the container, 0-1, relative to what it holds: the"
        " device, or for a MIG instance (mig_profile and mig_instance_id set) that instance"
        " (1 for a whole device or instance).",
        container_names,
    )
    by_uid = pods.by_uid()

    def labels_of(pod_uid: str, container: str, device_id: str) -> list[str] | None:
        pod = by_uid.get(pod_uid)
        place = places.get(device_id)
        if pod is None or place is None:
            return None
        device, instance = place.device, place.instance
        return [
            node,
            pod.namespace,
            pod.name,
            container,
            str(device.index),
            device.id,
            instance.profile if instance else "",
            str(instance.instance_id) if instance else "",
            *label_config.pod_values(pod),
        ]

    claim_users = allocations.claim_users if allocations is not None else {}
    if runtime.container_metrics is not None:
        for sample in runtime.container_metrics:
            pod_uid, _, container = sample.container_key.partition("/")
            # a DRA claim's sample ("claim/<uid>"): the usage of every container sharing it
            users = claim_users.get(container, ()) if pod_uid == CLAIM else ((pod_uid, container),)
            for user_uid, user_container in users:
                labels = labels_of(
                    user_uid, user_container or sample.container_name, sample.device_id
                )
                if labels is None:
                    continue
                util.add_metric(labels, sample.utilization_ratio)
                mem.add_metric(labels, float(sample.memory_used_bytes))
    if allocations is not None:
        for (pod_uid, container), shares in allocations.by_container.items():
            for device_id, share in shares.items():
                labels = labels_of(pod_uid, container, device_id)
                if labels is None:
                    continue
                core, memory = share_percents(share)
                core_alloc.add_metric(labels, core / WHOLE_PERCENT)
                mem_alloc.add_metric(labels, memory / WHOLE_PERCENT)
    return [util, mem, core_alloc, mem_alloc]
