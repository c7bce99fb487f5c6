"""What a fresh interpreter loads: for tests that keep the official Kubernetes client (tens
of MB and seconds of start-up) out of a process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable


def official_client(modules: Iterable[str]) -> list[str]:
    """The modules of the official Kubernetes client among `modules`, sorted."""
    return sorted(m for m in modules if m.split(".")[0] == "kubernetes")


def official_client_loaded_by(module: str) -> list[str]:
    """The official client's modules a fresh interpreter has loaded after `import module`."""
    code = f"import sys, {module}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return official_client(out.stdout.split())
