"""The pure rules behind delete's node cleanup and rollback's configuration restore."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lj_runtimekit.deploy.components import DeployError
from lj_runtimekit.deploy.manifests import config_checksum
from lj_runtimekit.deploy.verify import (
    PREVIOUS_DATA_ANNOTATION,
    node_key_patches,
    restore_previous_config,
    save_previous_config,
)
from lj_runtimekit.proto.pkg.protocol import load_protocol

PROTOCOL = load_protocol(str(Path(__file__).resolve().parents[2] / "deploy/protocol.yaml"))


def test_node_cleanup_removes_the_protocol_keys_and_the_controller_state_only() -> None:
    node = {
        "metadata": {
            "name": "gpu-0",
            "labels": {
                "lj_runtimekit_enable": "true",
                "lingjun.com/device-kind": "gpu",
                "lj-runtimekit.io/feature-state": "disabled",
                "kubernetes.io/hostname": "gpu-0",
                "envtest.lj-runtimekit.io/group": "g",
            },
            "annotations": {
                "lingjun.com/node-devices": "[]",
                "lj-runtimekit.io/feature-message": "ok",
                "node.alpha.kubernetes.io/ttl": "0",
            },
        }
    }
    bare = {"metadata": {"name": "cpu-0", "labels": {"kubernetes.io/hostname": "cpu-0"}}}
    assert node_key_patches([node, bare], PROTOCOL) == {
        "gpu-0": {
            "metadata": {
                "labels": {
                    "lingjun.com/device-kind": None,
                    "lj-runtimekit.io/feature-state": None,
                    "lj_runtimekit_enable": None,
                },
                "annotations": {
                    "lingjun.com/node-devices": None,
                    "lj-runtimekit.io/feature-message": None,
                },
            }
        }
    }


def _cm(data: dict[str, str], previous: dict[str, str] | None = None) -> dict[str, object]:
    meta: dict[str, object] = {"name": "cm"}
    if previous is not None:
        meta["annotations"] = {PREVIOUS_DATA_ANNOTATION: json.dumps(previous)}
    return {"metadata": meta, "data": data}


def test_restore_puts_back_the_recorded_data_and_records_the_replaced_one() -> None:
    old, new = {"a": "1"}, {"a": "2", "b": "3"}
    patch, current, previous = restore_previous_config([_cm(new, old)], ["cm"])["cm"]
    assert patch == {
        "metadata": {"annotations": {PREVIOUS_DATA_ANNOTATION: '{"a":"2","b":"3"}'}},
        "data": {"a": "1", "b": None},
    }
    assert (current, previous) == (config_checksum(new), config_checksum(old))
    assert restore_previous_config([_cm(old, old), _cm(old)], ["cm"]) == {}
    with pytest.raises(DeployError, match=f"ConfigMap cm annotation {PREVIOUS_DATA_ANNOTATION}"):
        restore_previous_config(
            [{"metadata": {"name": "cm", "annotations": {PREVIOUS_DATA_ANNOTATION: "{"}}}], ["cm"]
        )


def test_save_records_data_the_pods_ran_and_resets_after_an_image_only_change() -> None:
    old, new = {"a": "1"}, {"a": "2"}
    rendered = [{"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": new}]
    ran = {"cm": config_checksum(old)}
    record = {"metadata": {"annotations": {PREVIOUS_DATA_ANNOTATION: '{"a":"1"}'}}}
    assert save_previous_config([_cm(old)], ["cm"], rendered, ran) == {"cm": record}
    # A hand edit that never ran is not recorded.
    assert save_previous_config([_cm(old)], ["cm"], rendered, {"cm": "other"}) == {}
    # Unchanged data: nothing to record, unless an older record would be restored.
    assert save_previous_config([_cm(old)], ["cm"]) == {}
    assert save_previous_config([_cm(old, {"a": "0"})], ["cm"]) == {"cm": record}
