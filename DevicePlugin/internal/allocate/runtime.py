"""The Runtime's Allocate for one container, and its injection spec as the kubelet's answer."""

from __future__ import annotations

import grpc

from lj_runtimekit.deviceplugin.internal.allocate.ledger import describe
from lj_runtimekit.deviceplugin.internal.plugin.server import AllocationError
from lj_runtimekit.deviceplugin.internal.podlookup.lookup import ContainerInfo, PodInfo
from lj_runtimekit.deviceplugin.internal.rm.manager import RuntimeAccess
from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as rpb
from lj_runtimekit.proto.pkg.protocol import DeviceShare
from lj_runtimekit.proto.pkg.runtimeclient import (
    RuntimeCallError,
    RuntimeUnavailableError,
    to_request,
)

_PASSED_THROUGH = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
}


def container_response(spec: rpb.InjectionSpec) -> api_pb2.ContainerAllocateResponse:
    """The kubelet's ContainerAllocateResponse of a Runtime injection spec."""
    return api_pb2.ContainerAllocateResponse(
        envs=dict(spec.envs),
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in spec.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in spec.device_nodes
        ],
        annotations=dict(spec.annotations),
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in spec.cdi_devices],
    )


async def runtime_allocate(
    runtime: RuntimeAccess, pod: PodInfo, container: ContainerInfo, shares: tuple[DeviceShare, ...]
) -> rpb.AllocateResponse:
    """The Runtime's Allocate for the container (idempotent per container key); its refusal
    or absence as AllocationError (the Runtime's code where the kubelet should see it)."""
    ref = f"pod {pod.ref} container {container.name}"
    request = rpb.AllocateRequest(
        container_key=f"{pod.uid}/{container.name}",
        pod_namespace=pod.namespace,
        pod_name=pod.name,
        container_name=container.name,
        pod_uid=pod.uid,
        devices=[to_request(s) for s in shares],
        init_container=container.run_to_completion,
    )
    try:
        return await runtime.client.allocate(request)
    except RuntimeCallError as exc:
        code = exc.code if exc.code in _PASSED_THROUGH else grpc.StatusCode.UNAVAILABLE
        raise AllocationError(
            code, f"Runtime refused {describe(shares)} for {ref}: {exc.details}"
        ) from exc
    except RuntimeUnavailableError as exc:
        raise AllocationError(grpc.StatusCode.UNAVAILABLE, f"allocating for {ref}: {exc}") from exc
