"""MIG profiles: the names NVIDIA documents and the form of a profile name."""

from __future__ import annotations

import re
from collections.abc import Iterable

KNOWN_MIG_PROFILES: tuple[str, ...] = (
    # A30 24GB
    "1g.6gb",
    "2g.12gb",
    "4g.24gb",
    # A100 40GB
    "1g.5gb",
    "2g.10gb",
    "3g.20gb",
    "4g.20gb",
    "7g.40gb",
    # A100 80GB, H100 80GB
    "1g.10gb",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
    # H100 94GB
    "1g.12gb",
    "1g.24gb",
    "2g.24gb",
    "3g.47gb",
    "4g.47gb",
    "7g.94gb",
    # H200 141GB
    "1g.18gb",
    "1g.35gb",
    "2g.35gb",
    "3g.71gb",
    "4g.71gb",
    "7g.141gb",
)
"""The MIG profiles NVIDIA documents for the MIG-capable GPUs: the extender sample lists
each as `<resources.mig_prefix>/mig-<profile>`, and DRA mode with extended resources gets a
DeviceClass per profile by default."""

MIG_PROFILE_PATTERN = r"^[1-9][0-9]?g\.[1-9][0-9]{0,5}gb$"
"""A MIG profile name: compute slices and memory, e.g. `1g.10gb` (NVIDIA's naming)."""
_MIG_PROFILE_RE = re.compile(MIG_PROFILE_PATTERN)


def check_mig_profiles(profiles: Iterable[str]) -> tuple[str, ...]:
    """The profiles, each checked to be a MIG profile name like `1g.10gb` and listed once;
    a ValueError names the first that is not."""
    seen: list[str] = []
    for profile in profiles:
        if not _MIG_PROFILE_RE.fullmatch(profile):
            raise ValueError(
                f"MIG profile {profile!r} is not a profile name like 1g.10gb"
                " (<compute slices>g.<memory GB>gb)"
            )
        if profile in seen:
            raise ValueError(f"MIG profile {profile!r} is listed twice")
        seen.append(profile)
    return tuple(seen)
