"""LJ Runtime Kit envtest: a real Kubernetes control plane with KWOK nodes.

The Python counterpart of controller-runtime's envtest (docs/architecture.md, Tests).
"""

from lj_runtimekit.envtest.controlplane import (
    DRA_GATES,
    DRA_VERSION,
    ControlPlane,
    ControlPlaneConfig,
    ControlPlaneError,
    dra_gates,
)
from lj_runtimekit.envtest.kwok import (
    FAIL_EXIT_CODE_ANNOTATION,
    FAIL_MESSAGE_ANNOTATION,
    FAIL_REASON_ANNOTATION,
    failure_annotations,
)
from lj_runtimekit.envtest.nodes import (
    GROUP_LABEL,
    GpuNodeSpec,
    NodeFactory,
    ProtocolNames,
    Taint,
    gpu_node_manifest,
)
from lj_runtimekit.envtest.versions import ToolsMissingError, find_tools, load_versions

__all__ = [
    "DRA_GATES",
    "DRA_VERSION",
    "FAIL_EXIT_CODE_ANNOTATION",
    "FAIL_MESSAGE_ANNOTATION",
    "FAIL_REASON_ANNOTATION",
    "GROUP_LABEL",
    "ControlPlane",
    "ControlPlaneConfig",
    "ControlPlaneError",
    "GpuNodeSpec",
    "NodeFactory",
    "ProtocolNames",
    "Taint",
    "ToolsMissingError",
    "dra_gates",
    "failure_annotations",
    "find_tools",
    "gpu_node_manifest",
    "load_versions",
]
