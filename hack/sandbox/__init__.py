"""LJ Runtime Kit local sandbox: the whole Runtime Kit on a real control plane with KWOK
Lingjun nodes, each backed by its own Runtime simulator (`make sandbox`).

The same bed runs the end-to-end tests (tests/e2e) and benchmarks.
"""

from lj_runtimekit.sandbox.bed import NodeHandle, Sandbox, SandboxConfig, SandboxError

__all__ = ["NodeHandle", "Sandbox", "SandboxConfig", "SandboxError"]
