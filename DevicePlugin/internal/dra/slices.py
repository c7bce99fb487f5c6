"""The ResourceSlice model of DRA mode: the Runtime's inventory as resource.k8s.io/v1 slices."""

from __future__ import annotations

TYPE = "type"
"""Device attribute: the kind name (`gpu`, `ppu`, ...) of a device, `mig` of a MIG instance."""
MODE = "mode"
"""Device attribute: `exclusive`, `tdm` or `mig` (a MIG instance)."""
PROFILE = "profile"
"""Device attribute of a MIG instance: its profile, e.g. `1g.10gb`."""
MIG_TYPE = "mig"
TDM_MODE = "tdm"
