"""Injection spec: what `lj-runtime` needs to put a container's devices into it."""

from __future__ import annotations

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2
from lj_runtimekit.runtimesim.allocation import ContainerAllocation, Target
from lj_runtimekit.runtimesim.node import KIND_FACTS

ANNOTATION_PREFIX = "lingjun.com/"
LIBRARY_ROOT = "/run/amp/eKitC/xdm/lib"


def build_spec(allocation: ContainerAllocation) -> runtime_pb2.InjectionSpec:
    """Build the injection spec of an allocation (devices in request order)."""
    request = allocation.request
    targets = allocation.targets
    ids = [t.grant.device_id for t in targets]
    spec = runtime_pb2.InjectionSpec()
    spec.envs["LJ_VISIBLE_DEVICES"] = ",".join(ids)
    spec.envs["LJ_DEVICE_CORE_PERCENT"] = ",".join(str(t.grant.core_percent) for t in targets)
    spec.envs["LJ_DEVICE_MEMORY_PERCENT"] = ",".join(str(t.grant.memory_percent) for t in targets)
    gpus = [t.grant.device_id for t in targets if t.device.kind == "gpu"]
    if gpus:
        spec.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus)
    paths: list[str] = []
    for target in targets:
        for path in _device_paths(target):
            if path not in paths:
                paths.append(path)
    spec.device_nodes.extend(
        runtime_pb2.DeviceNode(container_path=p, host_path=p, permissions="rw") for p in paths
    )
    kinds = sorted({t.device.kind for t in targets})
    spec.mounts.extend(
        runtime_pb2.Mount(
            container_path=f"/usr/local/lingjun/{kind}/lib",
            host_path=f"{LIBRARY_ROOT}/{kind}",
            read_only=True,
        )
        for kind in kinds
    )
    spec.annotations.update(
        {
            f"{ANNOTATION_PREFIX}container-key": request.container_key,
            f"{ANNOTATION_PREFIX}pod-namespace": request.pod_namespace,
            f"{ANNOTATION_PREFIX}pod-name": request.pod_name,
            f"{ANNOTATION_PREFIX}pod-uid": request.pod_uid,
            f"{ANNOTATION_PREFIX}container-name": request.container_name,
            f"{ANNOTATION_PREFIX}claim-uid": request.claim_uid,
            f"{ANNOTATION_PREFIX}devices": ",".join(ids),
        }
    )
    spec.cdi_devices.extend(
        f"{KIND_FACTS[t.device.kind].cdi_kind}={t.grant.device_id}" for t in targets
    )
    return spec


def _device_paths(target: Target) -> list[str]:
    index = target.device.index
    if target.device.kind == "gpu":
        paths = [f"/dev/nvidia{index}", "/dev/nvidiactl", "/dev/nvidia-uvm"]
        if target.instance is not None:
            paths.append(f"/dev/nvidia-caps/nvidia-cap{index * 16 + target.instance.instance_id}")
        return paths
    if target.device.kind == "ppu":
        return [f"/dev/ppu{index}"]
    return [f"/dev/dri/renderD{128 + index}", "/dev/kfd"]
