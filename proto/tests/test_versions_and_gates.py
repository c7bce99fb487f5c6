"""Version parsing and the feature-gate table."""

from __future__ import annotations

import pytest

from lj_runtimekit.proto.pkg.featuregate import (
    BASE_MINIMUM,
    FEATURE_MINIMUMS,
    Feature,
    RuntimeTooOldError,
    evaluate,
)
from lj_runtimekit.proto.pkg.version import (
    InvalidVersionError,
    Version,
    component_version,
    parse_version,
)

OWN = Version(1, 15, 0)


@pytest.mark.parametrize("text", ["1.13.0", "v1.13.0", " v1.13.0 "])
def test_parse_accepts_both_spellings(text: str) -> None:
    assert parse_version(text) == Version(1, 13, 0)
    assert str(parse_version(text)) == "v1.13.0"


@pytest.mark.parametrize(
    "text", ["", "1.13", "v1.13.0.1", "x1.13.0", "1.13.0-rc1", "01.1.0", "abc"]
)
def test_parse_rejects_garbage_clearly(text: str) -> None:
    with pytest.raises(InvalidVersionError, match=r"Runtime version: .* expected v\{major\}"):
        parse_version(text, what="Runtime version")


def test_versions_order_numerically() -> None:
    assert parse_version("v1.9.0") < parse_version("v1.13.0") < parse_version("v1.13.1")


def test_table_matches_design() -> None:
    assert Version(1, 13, 0) == BASE_MINIMUM
    assert FEATURE_MINIMUMS[Feature.MIG] == Version(1, 14, 0)
    assert FEATURE_MINIMUMS[Feature.PPU_AMD_DEVICES] == Version(1, 14, 0)
    assert FEATURE_MINIMUMS[Feature.CONTAINER_METRICS] == Version(1, 14, 0)
    assert FEATURE_MINIMUMS[Feature.TOPOLOGY_GANG] == Version(1, 15, 0)


def test_below_a_minimum_only_that_feature_is_off() -> None:
    report = evaluate("v1.14.2", OWN)
    assert report.enabled == {Feature.MIG, Feature.PPU_AMD_DEVICES, Feature.CONTAINER_METRICS}
    assert not report.is_enabled(Feature.TOPOLOGY_GANG)
    assert report.messages == (
        "feature topology-gang is off: it needs Runtime v1.15.0, the node runs v1.14.2",
    )
    report.require_base()


def test_base_version_has_no_gated_feature() -> None:
    report = evaluate("1.13.0", OWN)
    assert report.enabled == frozenset()
    assert len(report.messages) == len(FEATURE_MINIMUMS)
    report.require_base()


def test_too_old_runtime_is_refused_with_needed_version() -> None:
    with pytest.raises(RuntimeTooOldError, match=r"Runtime v1\.12\.9 is too old.*v1\.13\.0"):
        evaluate("v1.12.9", OWN).require_base()


def test_other_major_vouches_for_nothing() -> None:
    report = evaluate("v2.0.0", OWN)
    assert report.enabled == frozenset()
    assert "major version 2" in report.messages[0]
    assert "major-1 contract" in report.messages[0]


def test_bad_runtime_version_is_clear() -> None:
    with pytest.raises(InvalidVersionError, match="Runtime version: 'latest'"):
        evaluate("latest", OWN)


def test_component_version_comes_from_version_file() -> None:
    from pathlib import Path

    version_file = Path(__file__).resolve().parents[2] / "VERSION"
    assert str(component_version()) == version_file.read_text().strip()
