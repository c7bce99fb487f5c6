"""Whether a cluster can run DRA mode: the alpha feature gates the DRA plugin's
ResourceSlices and DeviceClasses use, probed by a server-side dry run.

The API server drops the fields of a gate that is off instead of refusing the object, so
precheck creates (dry run) the ResourceSlices of a one-device pool and one DeviceClass that
use every such field and names each gate whose field did not come back. The pool is laid out
as the plugin lays out its own for the server's minor (slices.counters_apart: from 1.35 on,
the counter set in a slice of its own).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.slices import counters_apart
from lj_runtimekit.proto.pkg.protocol import Protocol

PROBE_NAME = "lj-runtimekit-dra-precheck"
"""The probe objects' name (a dry run: nothing is stored)."""

Obj = dict[str, Any]


def probe_objects(protocol: Protocol, server_minor: int) -> list[Obj]:
    """The ResourceSlices of a pool with a counter set and a shared device with consumable
    capacity and a taint, and a DeviceClass naming an extended resource."""
    driver = protocol.dra.driver
    apart = counters_apart(server_minor)
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
    counter_set = {"name": "gpu-0", "counters": {"memory": {"value": "1"}}}
    contents = [{"devices": [device]}, {"sharedCounters": [counter_set]}]
    if not apart:
        contents = [{"sharedCounters": [counter_set], "devices": [device]}]
    slices: list[Obj] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{PROBE_NAME}-{number}"},
            "spec": {
                "driver": driver,
                "nodeName": PROBE_NAME,
                "pool": {"name": PROBE_NAME, "generation": 1, "resourceSliceCount": len(contents)},
                **content,
            },
        }
        for number, content in enumerate(contents)
    ]
    device_class: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"{PROBE_NAME}.{driver}"},
        "spec": {"extendedResourceName": f"{driver}/precheck"},
    }
    return [*slices, device_class]


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
    specs = [i.get("spec") or {} for i in returned if i.get("kind") == "ResourceSlice"]
    devices = [d for spec in specs for d in spec.get("devices") or ()]
    device = devices[0] if devices else {}
    missing = {g for g, fields in GATES.items() if any(f not in device for f in fields)}
    if not any("sharedCounters" in spec for spec in specs):
        missing.add("DRAPartitionableDevices")
    for item in returned:
        spec = item.get("spec") or {}
        if item.get("kind") == "DeviceClass" and "extendedResourceName" not in spec:
            missing.add("DRAExtendedResource")
    return sorted(missing)
