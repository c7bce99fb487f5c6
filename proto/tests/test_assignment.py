"""Encoding of the device assignment annotation."""

from __future__ import annotations

import pytest

from lj_runtimekit.proto.pkg.protocol import (
    AssignmentError,
    DeviceShare,
    decode_assignment,
    encode_assignment,
)
from lj_runtimekit.proto.pkg.protocol.assignment import ASSIGNED_POD_UID, foreign_assignment


def test_round_trip_whole_and_slices() -> None:
    assignment = {
        "train": (DeviceShare("GPU-a"), DeviceShare("GPU-b")),
        "sidecar": (DeviceShare("GPU-c", core_percent=30, memory_percent=25),),
    }
    text = encode_assignment(assignment)
    assert text == (
        '{"sidecar":[{"core":30,"id":"GPU-c","memory":25}],"train":[{"id":"GPU-a"},{"id":"GPU-b"}]}'
    )
    assert decode_assignment(text) == assignment
    assert decode_assignment(text)["train"][0].whole
    assert not decode_assignment(text)["sidecar"][0].whole


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"c": {}}', "c: must be a list"),
        ('{"c": [1]}', r"c\[0\]: must be an object"),
        ('{"c": [{"core": 3}]}', r"c\[0\]\.id: must be a non-empty string"),
        ('{"c": [{"id": "g", "core": 101}]}', r"c\[0\]\.core: must be an integer 0\.\.100"),
        ('{"c": [{"id": "g", "memory": -1}]}', r"c\[0\]\.memory"),
        ('{"c": [{"id": "g", "memory": true}]}', r"c\[0\]\.memory"),
        ('{"c": [{"id": "g", "core": "30"}]}', r"c\[0\]\.core: must be an integer"),
    ],
)
def test_malformed_annotations_are_named(text: str, message: str) -> None:
    with pytest.raises(AssignmentError, match=message):
        decode_assignment(text)


def test_an_older_decoder_reads_a_newer_record() -> None:
    """A newer writer's fields (in a share, or for the whole pod under a key with a `/`)
    are ignored: the record decodes to the assignment its known fields say."""
    assignment = {
        "main": (DeviceShare("GPU-a"),),
        "side": (DeviceShare("GPU-b", core_percent=30, memory_percent=0),),
    }
    newer = (
        '{"lingjun.com/pod":{"uid":"u-1","generation":[2]},'
        '"main":[{"id":"GPU-a","numa":1}],'
        '"side":[{"core":30,"id":"GPU-b","memory":0,"priority":"high"}]}'
    )
    assert decode_assignment(newer) == assignment
    assert decode_assignment(newer) == decode_assignment(encode_assignment(assignment))


def test_an_assignment_copied_from_another_pod_is_told_apart() -> None:
    """The scheduler's UID names the pod the assignment was made for; without one (an
    older scheduler) the assignment is taken as the pod's own."""
    assert foreign_assignment({ASSIGNED_POD_UID: "u-1"}, "u-1") is None
    assert foreign_assignment({ASSIGNED_POD_UID: "u-1"}, "u-2") == "u-1"
    assert foreign_assignment({ASSIGNED_POD_UID: ""}, "u-2") == ""
    assert foreign_assignment({}, "u-2") is None
