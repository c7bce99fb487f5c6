"""Feature gates: which features a Runtime version supports (docs/architecture.md)."""

from lj_runtimekit.proto.pkg.featuregate.gates import (
    BASE_MINIMUM,
    FEATURE_MINIMUMS,
    Feature,
    GateReport,
    RuntimeTooOldError,
    evaluate,
)

__all__ = [
    "BASE_MINIMUM",
    "FEATURE_MINIMUMS",
    "Feature",
    "GateReport",
    "RuntimeTooOldError",
    "evaluate",
]
