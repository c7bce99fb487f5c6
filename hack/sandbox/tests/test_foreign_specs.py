"""The foreign-spec check over a kubelet device checkpoint (`testkit.invariant`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from lj_runtimekit.proto.k8s.deviceplugin.v1beta1 import api_pb2
from lj_runtimekit.proto.pkg.protocol import DeviceShare, encode_assignment, load_protocol
from lj_runtimekit.testkit.invariant import CONTAINER_KEY, checkpoint_specs, foreign_specs

PROTOCOL = load_protocol()
CORE = PROTOCOL.resources.core


def _pod(uid: str, assignment: Mapping[str, tuple[DeviceShare, ...]]) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ns",
            "name": f"pod-{uid}",
            "annotations": {PROTOCOL.annotations.assigned_devices: encode_assignment(assignment)},
        },
        "spec": {
            "containers": [{"name": "main"}],
            "initContainers": [{"name": "prep"}, {"name": "side", "restartPolicy": "Always"}],
        },
        "status": {"phase": "Running"},
    }


def _entry(uid: str, container: str, key: str, visible: str, units: list[str]) -> dict[str, Any]:
    response = api_pb2.ContainerAllocateResponse(
        envs={"LJ_VISIBLE_DEVICES": visible}, annotations={CONTAINER_KEY: key}
    )
    return {
        "PodUID": uid,
        "ContainerName": container,
        "ResourceName": CORE,
        "DeviceIDs": {"-1": units},
        "AllocResp": base64.b64encode(response.SerializeToString()).decode(),
    }


def test_a_container_served_another_pods_spec_is_named() -> None:
    mine = {"main": (DeviceShare("g0", 30, 30),), "side": (DeviceShare("g0", 20, 20),)}
    pods = [_pod("a", mine), _pod("b", {"main": (DeviceShare("g0", 20, 20),)})]
    checkpoint = {
        "Data": {
            "PodDeviceEntries": [
                _entry("a", "main", "a/main", "g0", ["g0::1"]),
                _entry("a", "side", "a/side", "g0", ["g0::2"]),
                # a finished init container is not running: not checked
                _entry("a", "prep", "x/prep", "g9", ["g0::3"]),
                _entry("b", "main", "a/main", "g0", ["g0::4"]),  # its neighbour's spec
                _entry("b", "side", "b/side", "g1", ["g1::1"]),  # a device not its pod's
            ],
            "RegisteredDevices": {},
        },
        "Checksum": 0,
    }
    specs = checkpoint_specs(json.dumps(checkpoint))
    assert [(s.pod_uid, s.container, s.device_ids) for s in specs][:1] == [
        ("a", "main", ("g0::1",))
    ]
    assert foreign_specs(specs, pods, PROTOCOL) == [
        f"pod ns/pod-b container main ({CORE}): container key 'a/main'",
        f"pod ns/pod-b container side ({CORE}): visible devices g1, its pod's assignment ['g0']",
    ]
