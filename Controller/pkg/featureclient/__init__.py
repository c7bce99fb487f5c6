"""The Runtime's node-feature switch, called through the shared RuntimeClient."""

from lj_runtimekit.controller.pkg.featureclient.client import (
    disable_features,
    enable_features,
    feature_state,
)

__all__ = ["disable_features", "enable_features", "feature_state"]
