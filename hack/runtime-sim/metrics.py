"""Simulated metrics: deterministic for a seed, driven by what containers hold.

Each device sample (GetDeviceMetrics) advances the sample number by one;
container samples read the current sample number, so a device sample and the
container samples taken after it agree. Every value is drawn from an RNG seeded
with (seed, object, sample number): two simulators with the same seed, node
and allocations answer the same numbers for the same call sequence. Energy
accumulates power x SAMPLE_PERIOD_S per device sample.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2
from lj_runtimekit.runtimesim.allocation import AllocationRequest, Allocator, Target
from lj_runtimekit.runtimesim.inventory import DeviceInfo
from lj_runtimekit.runtimesim.node import KIND_FACTS, MIG_COMPUTE_SLICES
from lj_runtimekit.runtimesim.state import NodeState

SAMPLE_PERIOD_S = 1.0
_IDLE_NOISE = 0.03
_DRIVER_OVERHEAD_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Usage:
    """One container's use of one device or MIG instance at a sample."""

    target: Target
    request: AllocationRequest
    utilization_ratio: float
    memory_used_bytes: int


class MetricsModel:
    """Produces device, MIG instance and container samples for a node."""

    def __init__(self, seed: int, state: NodeState, allocator: Allocator) -> None:
        self._seed = seed
        self._state = state
        self._allocator = allocator
        self._sample = 0
        self._energy = {d.id: 0.0 for d in state.devices}

    def device_metrics(self) -> list[runtime_pb2.DeviceMetrics]:
        """Take the next device sample: one entry per device, ordered by index."""
        self._sample += 1
        usage = self._usage()
        return [self._device(device, usage) for device in self._state.devices]

    def container_metrics(self) -> list[runtime_pb2.ContainerMetrics]:
        """Per-container usage at the current sample, one entry per container and device."""
        out = []
        for use in self._usage():
            request = use.request
            out.append(
                runtime_pb2.ContainerMetrics(
                    container_key=request.container_key,
                    pod_namespace=request.pod_namespace,
                    pod_name=request.pod_name,
                    container_name=request.container_name,
                    device_id=use.target.grant.device_id,
                    utilization_ratio=use.utilization_ratio,
                    memory_used_bytes=use.memory_used_bytes,
                )
            )
        return out

    def _rng(self, *parts: str) -> random.Random:
        seed = "/".join((str(self._seed), str(self._sample), *parts))
        return random.Random(seed)  # noqa: S311 (simulation, not security)

    def _usage(self) -> list[Usage]:
        out = []
        for allocation in self._allocator.allocations():
            request = allocation.request
            for target in allocation.targets:
                rng = self._rng("container", request.container_key, target.grant.device_id)
                total = (
                    target.instance.profile.memory_bytes
                    if target.instance
                    else target.device.memory_bytes
                )
                core = target.grant.core_percent / 100
                memory = target.grant.memory_percent / 100
                out.append(
                    Usage(
                        target=target,
                        request=request,
                        utilization_ratio=round(core * rng.uniform(0.3, 0.95), 4),
                        memory_used_bytes=int(total * memory * rng.uniform(0.2, 0.9)),
                    )
                )
        return out

    def _device(self, device: DeviceInfo, usage: list[Usage]) -> runtime_pb2.DeviceMetrics:
        rng = self._rng("device", device.id)
        sample = runtime_pb2.DeviceMetrics(
            device_id=device.id,
            memory_total_bytes=device.memory_bytes,
            xid_errors=self._state.xid_errors[device.id],
        )
        if device.mig_instances:
            for instance in device.mig_instances:
                on = [u for u in usage if u.target.grant.device_id == instance.id]
                noise = self._rng("mig", instance.id).uniform(0, _IDLE_NOISE)
                util = min(1.0, sum(u.utilization_ratio for u in on) + noise)
                total = instance.profile.memory_bytes
                used = min(total, sum(u.memory_used_bytes for u in on))
                sample.mig_instances.append(
                    runtime_pb2.MigInstanceMetrics(
                        instance_id=instance.id,
                        utilization_ratio=round(util, 4),
                        memory_used_bytes=used,
                        memory_total_bytes=total,
                    )
                )
            util = sum(
                m.utilization_ratio * i.profile.compute_slices / MIG_COMPUTE_SLICES
                for m, i in zip(sample.mig_instances, device.mig_instances, strict=True)
            )
            used = sum(m.memory_used_bytes for m in sample.mig_instances)
        else:
            on = [u for u in usage if u.target.grant.device_id == device.id]
            util = min(1.0, sum(u.utilization_ratio for u in on) + rng.uniform(0, _IDLE_NOISE))
            used = sum(u.memory_used_bytes for u in on)
        overhead = rng.randint(0, _DRIVER_OVERHEAD_BYTES)
        sample.utilization_ratio = round(util, 4)
        sample.memory_used_bytes = min(device.memory_bytes, used + overhead)
        sample.temperature_celsius = round(32 + 45 * util + rng.uniform(-1, 1), 2)
        facts = KIND_FACTS[device.kind]
        idle, peak = facts.idle_watts, facts.max_watts
        sample.power_watts = round(idle + (peak - idle) * util + rng.uniform(-2, 2), 2)
        self._energy[device.id] += sample.power_watts * SAMPLE_PERIOD_S
        sample.energy_joules = round(self._energy[device.id], 2)
        return sample
