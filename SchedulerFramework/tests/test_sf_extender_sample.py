"""The extender sample config is generated from the protocol and kept up to date."""

from __future__ import annotations

import pytest
import yaml

from lj_runtimekit.proto.pkg import devicekind
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.schedulerframework.internal.extender import sample

P = load_protocol()


def test_the_committed_sample_is_the_generated_one() -> None:
    committed = sample.SAMPLE.read_text(encoding="utf-8")
    assert committed == sample.render(P), (
        "stale: run uv run python -m lj_runtimekit.schedulerframework.internal.extender.sample"
    )
    assert sample.main(["--check"]) == 0


def test_every_extended_resource_of_the_protocol_is_managed() -> None:
    doc = yaml.safe_load(sample.render(P))
    managed = {m["name"] for m in doc["extenders"][0]["managedResources"]}
    r = P.resources
    for kind in devicekind.kinds():
        assert kind.resource(r) in managed
    assert {r.gpu, r.ppu, r.amd, r.core, r.memory, r.mig("1g.10gb"), r.mig("7g.80gb")} <= managed


def test_a_new_kind_makes_the_committed_sample_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    known = devicekind.whole_resources(P.resources)
    npu = devicekind.DeviceKind(99, "npu", "gpu", None, shareable=False)
    monkeypatch.setattr(devicekind, "whole_resources", lambda r: {**known, "example.com/npu": npu})
    text = sample.render(P)
    assert "- name: example.com/npu" in text
    assert text != sample.SAMPLE.read_text(encoding="utf-8")
    assert sample.main(["--check"]) == 1
