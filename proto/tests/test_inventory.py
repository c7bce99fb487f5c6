"""Encoding of the node device inventory annotation."""

from __future__ import annotations

import pytest

from lj_runtimekit.proto.pkg.protocol import (
    DeviceLink,
    InventoryError,
    MigSlot,
    NodeDevice,
    decode_inventory,
    encode_inventory,
    load_protocol,
)


def test_round_trip_tdm_mig_and_links() -> None:
    devices = (
        NodeDevice(
            "GPU-b",
            1,
            numa=1,
            links=(DeviceLink("GPU-a", "nvlink", 600),),
        ),
        NodeDevice("GPU-a", 0, numa=0, links=(DeviceLink("GPU-b", "nvlink", 600),)),
        NodeDevice(
            "GPU-c",
            2,
            mode="mig",
            healthy=False,
            mig=(MigSlot("MIG-c-1", "3g.40gb"), MigSlot("MIG-c-2", "4g.40gb")),
        ),
    )
    text = encode_inventory(devices)
    assert text.startswith('{"devices":[{"id":"GPU-a","index":0,"kind":"gpu","mode":"tdm"')
    decoded = decode_inventory(text)
    assert [d.id for d in decoded] == ["GPU-a", "GPU-b", "GPU-c"]
    assert decoded == tuple(sorted(devices, key=lambda d: d.index))


def test_defaults_for_omitted_fields() -> None:
    (dev,) = decode_inventory('{"devices":[{"id":"0","index":0,"kind":"gpu","mode":"exclusive"}]}')
    assert dev == NodeDevice("0", 0, mode="exclusive")
    assert dev.numa == -1
    assert dev.healthy


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "inventory: must be an object"),
        ('{"devs": []}', r"unknown fields \['devs'\]"),
        ('{"devices": {}}', "inventory.devices: must be a list"),
        ('{"devices": [{"index": 0, "kind": "gpu", "mode": "tdm"}]}', r"devices\[0\]\.id"),
        ('{"devices": [{"id": "a", "kind": "gpu", "mode": "tdm"}]}', r"devices\[0\]\.index"),
        ('{"devices": [{"id": "a", "index": 0, "kind": "tpu", "mode": "tdm"}]}', "kind: must be"),
        ('{"devices": [{"id": "a", "index": 0, "kind": "gpu", "mode": "mps"}]}', "mode: must be"),
        (
            '{"devices": [{"id": "a", "index": 0, "kind": "gpu", "mode": "tdm"},'
            ' {"id": "a", "index": 1, "kind": "gpu", "mode": "tdm"}]}',
            "duplicate device id",
        ),
        (
            '{"devices": [{"id": "a", "index": 0, "kind": "gpu", "mode": "tdm",'
            ' "links": [{"peer": "b", "kind": "infiniband"}]}]}',
            r"links\[0\]\.kind",
        ),
        (
            '{"devices": [{"id": "a", "index": 0, "kind": "gpu", "mode": "tdm",'
            ' "mig": [{"id": "m", "profile": "1g.10gb"}]}]}',
            "MIG instances on a device in tdm mode",
        ),
        (
            '{"devices": [{"id": "a", "index": 0, "kind": "gpu", "mode": "tdm", "healthy": 1}]}',
            "healthy: must be true or false",
        ),
    ],
)
def test_rejects_malformed(text: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        decode_inventory(text)


def test_annotation_key_is_a_protocol_constant() -> None:
    assert load_protocol().annotations.node_devices == "lingjun.com/node-devices"
