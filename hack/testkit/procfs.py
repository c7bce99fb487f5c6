"""What /proc says of a process, for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path


def status_mb(pid: int, key: str = "VmRSS") -> float:
    """A memory line of /proc/<pid>/status in MiB: VmRSS (resident now) or VmHWM (peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"/proc/{pid}/status has no {key}")
