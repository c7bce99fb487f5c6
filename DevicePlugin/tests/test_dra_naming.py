"""Device names in ResourceSlices and allocated capacity read back as Runtime shares."""

from __future__ import annotations

import pytest

from lj_runtimekit.deviceplugin.internal.dra.naming import (
    CORES,
    MEMORY,
    ShareError,
    device_name,
    memory_step,
    mig_name,
    resolve,
    share_of,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import DeviceShare

GIB = 1 << 30


def _gpu(index: int, mode: pb.DeviceMode.ValueType, memory: int = 80 * GIB) -> pb.Device:
    return pb.Device(
        id=f"GPU-{index}", index=index, kind=pb.DEVICE_KIND_GPU, memory_bytes=memory, mode=mode
    )


def test_names_resolve_back_to_the_runtime_ids() -> None:
    tdm = _gpu(0, pb.DEVICE_MODE_TDM)
    mig = _gpu(1, pb.DEVICE_MODE_MIG)
    mig.mig_instances.add(id="MIG-a", profile="1g.10gb", instance_id=9, parent_id="GPU-1")
    devices = [tdm, mig]
    assert device_name(tdm) == "gpu-0"
    assert mig_name(mig, mig.mig_instances[0]) == "gpu-1-mig-9"
    ref = resolve(devices, "gpu-1-mig-9")
    assert ref is not None
    assert ref.runtime_id == "MIG-a"
    ref = resolve(devices, "gpu-0")
    assert ref is not None
    assert ref.runtime_id == "GPU-0"
    assert resolve(devices, "gpu-1-mig-8") is None
    assert resolve(devices, "gpu-7") is None
    assert resolve(devices, "ppu-0") is None


def test_consumed_capacity_is_the_runtime_percentages() -> None:
    gpu = _gpu(0, pb.DEVICE_MODE_TDM)
    ref = resolve([gpu], "gpu-0")
    assert ref is not None
    step = memory_step(gpu)
    assert share_of(ref, None) == DeviceShare("GPU-0")
    assert share_of(ref, {CORES: "30", MEMORY: str(25 * step)}) == DeviceShare("GPU-0", 30, 25)
    assert share_of(ref, {CORES: "30", MEMORY: "0"}) == DeviceShare("GPU-0", 30, 0)
    # A quarter of 80 GiB in bytes is 25 % (1 % steps are rounded up, not down).
    assert share_of(ref, {CORES: "0", MEMORY: "20Gi"}) == DeviceShare("GPU-0", 0, 25)
    assert share_of(ref, {CORES: "0", MEMORY: str(25 * step + 1)}) == DeviceShare("GPU-0", 0, 26)
    # Only cores asked: memory took its default, all of it.
    assert share_of(ref, {CORES: "30"}) == DeviceShare("GPU-0", 30, 100)
    assert share_of(ref, {CORES: "100", MEMORY: str(gpu.memory_bytes)}) == DeviceShare("GPU-0")


@pytest.mark.parametrize(
    ("consumed", "message"),
    [
        ({CORES: "0", MEMORY: "0"}, "a slice of 0 cores and 0 memory is no share"),
        ({CORES: "101"}, "is more than the device has"),
        ({CORES: "-1"}, "is negative"),
        ({CORES: "lots"}, "consumed capacity cores='lots'"),
        ({"bandwidth": "1"}, "unknown consumed capacity bandwidth"),
    ],
)
def test_capacity_the_runtime_cannot_serve_is_refused(
    consumed: dict[str, str], message: str
) -> None:
    ref = resolve([_gpu(0, pb.DEVICE_MODE_TDM)], "gpu-0")
    assert ref is not None
    with pytest.raises(ShareError, match=message):
        share_of(ref, consumed)


def test_capacity_on_an_unshared_device_is_refused() -> None:
    ref = resolve([_gpu(0, pb.DEVICE_MODE_EXCLUSIVE)], "gpu-0")
    assert ref is not None
    with pytest.raises(ShareError, match="device gpu-0 is not shared"):
        share_of(ref, {CORES: "30"})
