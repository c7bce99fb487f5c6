"""glibc malloc arena cap, set once at start-up before any thread runs."""

from __future__ import annotations

import ctypes
import os

MALLOC_ARENAS = 2
"""glibc malloc arenas at most (MALLOC_ARENA_MAX), see `cap_malloc_arenas`."""
_M_ARENA_MAX = -8  # glibc's mallopt parameter


def cap_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas, as MALLOC_ARENA_MAX does, unless that variable is set.

    glibc gives threads that allocate at once arenas of their own, up to 8 per CPU, and
    keeps what is freed in each: the API thread pool's arenas held about 6 MB at the
    500-node benchmark's peak. The Controller's threads mostly wait on the API server (and
    allocate under the GIL), so sharing two arenas costs no throughput. Must run before
    the threads start; False where it does not apply (not glibc, or the variable is set).
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))
