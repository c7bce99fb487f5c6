"""Scheduling framework value types: status codes, cycle state, PreFilter results.

The parsed pod (`PodInfo`) and Kubernetes quantities are the cache's object model
(`cache/podinfo.py`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass


def nodes_unavailable(total: int, reasons: Mapping[str, int]) -> str:
    """Upstream's FitError text: "0/N nodes are available: 2 reason, 3 reason." (reasons
    with their node counts, sorted as text)."""
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items() if count)
    return f"0/{total} nodes are available: {', '.join(parts) or 'no nodes'}."


UNKNOWN_OUTCOME_STATUSES = frozenset({0, 504})
"""HTTP statuses of a write that may have landed (0: no answer; a gateway timeout)."""


class Code(enum.IntEnum):
    """Outcome of a plugin call (upstream framework.Code)."""

    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5


@dataclass(frozen=True)
class Status:
    """A plugin's verdict with human-readable reasons (aggregated into events)."""

    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""
    outcome_unknown: bool = False
    """An ERROR after which the write may still have taken effect (no answer, a timeout): the
    scheduler keeps what it assumed until the watch tells."""

    @property
    def ok(self) -> bool:
        return self.code == Code.SUCCESS

    @property
    def rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    def message(self) -> str:
        return ", ".join(self.reasons)

    def with_plugin(self, plugin: str) -> Status:
        return (
            self if self.plugin else Status(self.code, self.reasons, plugin, self.outcome_unknown)
        )


SUCCESS = Status()
SKIP = Status(Code.SKIP)


def unschedulable(*reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reasons)


def unresolvable(*reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons)


def error(*reasons: str) -> Status:
    return Status(Code.ERROR, reasons)


class CycleState:
    """Per-pod scratch space shared by the plugins of one scheduling cycle."""

    __slots__ = ("_data", "binding_annotations", "ruled_out", "skip_filter", "skip_score")

    def __init__(self) -> None:
        self._data: dict[str, object] = {}
        self.binding_annotations: dict[str, str] = {}
        """Annotations the Bind step writes with the Binding (one write per pod)."""
        self.skip_filter: set[str] = set()
        self.skip_score: set[str] = set()
        self.ruled_out: list[tuple[AbstractSet[str], Status]] = []
        """Groups of nodes a PreFilter already judged, with the status its Filter would give
        each of them: the search records it for those nodes without running the Filters."""

    def ruled_out_status(self, name: str) -> Status | None:
        """The status a PreFilter already gave node `name` (`ruled_out`), else None."""
        for names, status in self.ruled_out:
            if name in names:
                return status
        return None

    def write(self, key: str, value: object) -> None:
        self._data[key] = value

    def read(self, key: str) -> object | None:
        return self._data.get(key)


class ClusterEvent:
    """Cluster events that may make an unschedulable pod schedulable (upstream's
    framework.ClusterEvent); plugins register the ones that matter to what they reject."""

    NODE_ADD = "NodeAdd"
    NODE_ALLOCATABLE = "NodeAllocatable"
    """A node's allocatable or its device inventory changed."""
    NODE_LABEL = "NodeLabel"
    NODE_TAINT = "NodeTaint"
    """A node's taints or spec.unschedulable changed."""
    POD_DELETE = "AssignedPodDelete"
    """A pod on a node went (deleted, finished) or a reservation was released."""
    POD_DEVICES = "AssignedPodDevices"
    """The devices an assigned pod holds changed (some may be free)."""
    RESOURCE_CLAIM = "ResourceClaimChange"
    """A ResourceClaim came, changed (its allocation went) or went."""
    RESOURCE_SLICE = "ResourceSliceChange"
    """A node's published devices changed."""
    DEVICE_CLASS = "DeviceClassChange"


ALL_EVENTS = frozenset(
    {
        ClusterEvent.NODE_ADD,
        ClusterEvent.NODE_ALLOCATABLE,
        ClusterEvent.NODE_LABEL,
        ClusterEvent.NODE_TAINT,
        ClusterEvent.POD_DELETE,
        ClusterEvent.POD_DEVICES,
        ClusterEvent.RESOURCE_CLAIM,
        ClusterEvent.RESOURCE_SLICE,
        ClusterEvent.DEVICE_CLASS,
    }
)


@dataclass(frozen=True)
class PreFilterResult:
    """Nodes a PreFilter plugin narrows the search to, in the order to try them.

    `excluded_reason` is the reason reported for every node left out (it is
    aggregated into the FailedScheduling event like a Filter rejection).
    """

    node_names: tuple[str, ...] | list[str]
    excluded_reason: str = ""
    enough: int = 0
    """When > 0 the names are ranked best first: finding this many feasible ones is enough."""
    plugins: tuple[str, ...] = ()
    """The plugins that narrowed the nodes (set by the framework)."""
