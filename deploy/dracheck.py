"""Whether a cluster can run DRA mode: the alpha feature gates the DRA plugin's
ResourceSlices and DeviceClasses use, probed by a server-side dry run.

The API server drops the fields of a gate that is off instead of refusing the object, so
precheck creates (dry run) one ResourceSlice and one DeviceClass that use every such field
and names each gate whose field did not come back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lj_runtimekit.proto.pkg.protocol import Protocol

PROBE_NAME = "lj-runtimekit-dra-precheck"
"""The probe objects' name (a dry run: nothing is stored)."""

Obj = dict[str, Any]


def probe_objects(protocol: Protocol) -> list[Obj]:
    """A ResourceSlice with a counter set, a shared device with consumable capacity and a
    taint, and a DeviceClass naming an extended resource."""
    driver = protocol.dra.driver
    device: Obj = {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "capacity": {
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "step": "1"}},
            }
        },
        "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1"}}}],
        "taints": [{"key": f"{driver}/precheck", "effect": "NoSchedule"}],
    }
    slice_: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": PROBE_NAME},
        "spec": {
            "driver": driver,
            "nodeName": PROBE_NAME,
            "pool": {"name": PROBE_NAME, "generation": 1, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "1"}}}],
            "devices": [device],
        },
    }
    device_class: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"{PROBE_NAME}.{driver}"},
        "spec": {"extendedResourceName": f"{driver}/precheck"},
    }
    return [slice_, device_class]


GATES: Mapping[str, tuple[str, ...]] = {
    "DRAConsumableCapacity": ("allowMultipleAllocations",),
    "DRAPartitionableDevices": ("consumesCounters",),
    "DRADeviceTaints": ("taints",),
}
"""Each gate and the device field it keeps."""


def returned_objects(text: str) -> list[Obj]:
    """The objects `kubectl create --dry-run=server -o json` printed: one JSON document per
    object, or a List."""
    decoder = json.JSONDecoder()
    objects: list[Obj] = []
    at = 0
    while (at := _skip_space(text, at)) < len(text):
        doc, at = decoder.raw_decode(text, at)
        objects += (doc.get("items") or []) if doc.get("kind") == "List" else [doc]
    return objects


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def missing_gates(returned: list[Obj]) -> list[str]:
    """The gates whose fields the API server dropped from the probe objects (`returned`, as
    `returned_objects` reads them)."""
    missing: set[str] = set()
    for item in returned:
        spec = item.get("spec") or {}
        if item.get("kind") == "ResourceSlice":
            device = (spec.get("devices") or [{}])[0]
            missing |= {g for g, fields in GATES.items() if any(f not in device for f in fields)}
            if "sharedCounters" not in spec:
                missing.add("DRAPartitionableDevices")
        elif item.get("kind") == "DeviceClass" and "extendedResourceName" not in spec:
            missing.add("DRAExtendedResource")
    return sorted(missing)
