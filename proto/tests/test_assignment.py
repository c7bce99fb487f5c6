"""Encoding of the device assignment annotation."""

from __future__ import annotations

import pytest

from lj_runtimekit.proto.pkg.protocol import (
    AssignmentError,
    DeviceShare,
    decode_assignment,
    encode_assignment,
)


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
        ('{"c": [{"id": "g", "cores": 1}]}', r"unknown fields \['cores'\]"),
    ],
)
def test_malformed_annotations_are_named(text: str, message: str) -> None:
    with pytest.raises(AssignmentError, match=message):
        decode_assignment(text)
