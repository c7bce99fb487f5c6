"""Extension points of the scheduling framework: one Protocol each, in cycle order.

A plugin class inherits the Protocols of the extension points it implements (so mypy
checks its methods against them) and has a `name`. `check_plugin` verifies a plugin when
a profile is built: a declared point left unimplemented, or an extension method defined
without its point (a misspelling, a forgotten base class), is an error there instead of
a point silently skipped. Upstream equivalents: k8s.io/kubernetes/pkg/scheduler/framework.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.framework.types import (
    CycleState,
    PreFilterResult,
    Status,
)

if TYPE_CHECKING:
    from lj_runtimekit.proto.pkg.protocol import Protocol as ProtocolConstants
    from lj_runtimekit.schedulerframework.internal.cache.cache import Cache
    from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo

MAX_NODE_SCORE = 100


def scale_to_max(scores: dict[str, int], reverse: bool) -> None:
    """Upstream's DefaultNormalizeScore, in place: the highest score becomes MAX_NODE_SCORE
    and the rest in proportion; `reverse` turns it around (for counts where fewer is better)."""
    top = max(scores.values(), default=0)
    for name, value in scores.items():
        scaled = value * MAX_NODE_SCORE // top if top else 0
        scores[name] = MAX_NODE_SCORE - scaled if reverse else scaled


@runtime_checkable
class Plugin(Protocol):
    @property
    def name(self) -> str: ...


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, state: CycleState, pod: PodInfo) -> tuple[PreFilterResult | None, Status]:
        """Checks the pod once per cycle; may narrow the nodes to try (in order)."""
        ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        """Can the pod run on this node?"""
        ...


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(
        self, state: CycleState, pod: PodInfo, statuses: Mapping[str, Status]
    ) -> tuple[str | None, Status]:
        """Called when no node fits; may make room (returns a nominated node)."""
        ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        """0..MAX_NODE_SCORE, higher is better (or any range when normalize_score exists)."""
        ...


@runtime_checkable
class ScoreExtensions(Plugin, Protocol):
    def normalize_score(self, state: CycleState, pod: PodInfo, scores: dict[str, int]) -> None:
        """Rescales this plugin's scores of all feasible nodes in place to 0..MAX_NODE_SCORE."""
        ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        """Claims what the pod needs on the chosen node (before binding)."""
        ...

    def unreserve(self, state: CycleState, pod: PodInfo, node_name: str) -> None:
        """Gives back what `reserve` claimed; must be idempotent."""
        ...


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    def permit(self, state: CycleState, pod: PodInfo, node_name: str) -> tuple[Status, float]:
        """SUCCESS, a rejection, or WAIT with a timeout in seconds (see WaitingPod)."""
        ...


@runtime_checkable
class PreBindPlugin(Plugin, Protocol):
    def pre_bind(self, state: CycleState, pod: PodInfo, node_name: str) -> Status: ...


@runtime_checkable
class BindPlugin(Plugin, Protocol):
    def bind(self, state: CycleState, pod: PodInfo, node_name: str) -> Status:
        """Binds the pod, or returns SKIP to let the next bind plugin do it."""
        ...


@runtime_checkable
class PostBindPlugin(Plugin, Protocol):
    def post_bind(self, state: CycleState, pod: PodInfo, node_name: str) -> None: ...


@runtime_checkable
class EnqueueExtensions(Plugin, Protocol):
    def events_to_register(self) -> frozenset[str]:
        """The ClusterEvents after which a pod this plugin rejected may fit (a plugin without
        them: every event)."""
        ...


@runtime_checkable
class QueueingHintPlugin(Plugin, Protocol):
    def queueing_hint(self, pod: PodInfo, old: NodeInfo | None, new: NodeInfo) -> bool:
        """Whether a node event (`old`: the node before, None when new) may make `pod`, which
        this plugin rejected, fit (upstream's QueueingHintFn); events without a node, or
        plugins without it, always may."""
        ...


def passes_now(plugin: FilterPlugin, pod: PodInfo, old: NodeInfo | None, new: NodeInfo) -> bool:
    """The queueing hint of a Filter that reads only the pod and the node: the node passes it
    now and did not before."""
    state = CycleState()
    return plugin.filter(state, pod, new).ok and (
        old is None or not plugin.filter(state, pod, old).ok
    )


@runtime_checkable
class PodEventPlugin(Plugin, Protocol):
    def on_pod_event(self, etype: str, pod: PodInfo) -> None:
        """Every pod of this scheduler seen by the watch (ADDED / MODIFIED / DELETED)."""
        ...


EXTENSION_POINTS: tuple[type[Plugin], ...] = (
    PreFilterPlugin,
    FilterPlugin,
    PostFilterPlugin,
    ScorePlugin,
    ScoreExtensions,
    ReservePlugin,
    PermitPlugin,
    PreBindPlugin,
    BindPlugin,
    PostBindPlugin,
    EnqueueExtensions,
    QueueingHintPlugin,
    PodEventPlugin,
)


class PluginError(TypeError):
    """A plugin class that does not match the extension points it declares."""


def _methods(point: type[Plugin]) -> tuple[str, ...]:
    return tuple(n for n, v in vars(point).items() if inspect.isfunction(v) and n[0] != "_")


def check_plugin(plugin: Plugin) -> None:
    """Raise PluginError unless `plugin` implements exactly the extension points it
    declares (its Protocol base classes)."""
    cls = type(plugin)
    declared = [p for p in EXTENSION_POINTS if p in cls.__mro__]
    stubs = {id(v) for p in EXTENSION_POINTS for v in vars(p).values()}
    where = f"scheduler plugin {plugin.name} ({cls.__module__}.{cls.__qualname__})"
    if not declared:
        raise PluginError(f"{where}: declares no extension point (inherit e.g. FilterPlugin)")
    for point in declared:
        for method in _methods(point):
            if id(inspect.getattr_static(cls, method)) in stubs:
                raise PluginError(
                    f"{where}: declares {point.__name__} but does not implement {method}"
                )
    known = {m: p for p in EXTENSION_POINTS for m in _methods(p)}
    for name in dir(cls):
        if name.startswith("_") or not callable(getattr(cls, name, None)):
            continue
        owner = known.get(name)
        if owner is not None and owner not in declared:
            raise PluginError(f"{where}: defines {name} but does not declare {owner.__name__}")
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85)
        if owner is None and close:
            raise PluginError(
                f"{where}: {name} is not an extension point; did you mean {close[0]}?"
            )


class WaitingPod(Protocol):
    """A pod parked at Permit; any plugin may allow or reject it (gang scheduling)."""

    @property
    def pod(self) -> PodInfo: ...

    @property
    def node_name(self) -> str: ...

    def pending_plugins(self) -> list[str]: ...

    def allow(self, plugin: str) -> None:
        """Takes effect at once: a later rejection (the timer) is ignored. Allowed in a
        scheduling cycle, the pod's bind starts once the cycle is over."""
        ...

    def reject(self, plugin: str, message: str) -> None:
        """Unreserves the pod and hands it back (ignored once it is allowed or rejected)."""
        ...


class Handle(Protocol):
    """What a plugin may use of the scheduler that runs it."""

    @property
    def cache(self) -> Cache: ...

    @property
    def protocol(self) -> ProtocolConstants: ...

    def iterate_waiting_pods(self) -> Iterator[WaitingPod]: ...

    def get_waiting_pod(self, uid: str) -> WaitingPod | None: ...

    def event(self, pod: PodInfo, kind: str, reason: str, message: str) -> None:
        """Records an Event on the pod (aggregated, asynchronous)."""
        ...

    def bind_pod(self, pod: PodInfo, node_name: str, annotations: Mapping[str, str]) -> Status:
        """Writes the Binding (with annotations: one write per pod); an ERROR with
        `outcome_unknown` when no answer came (the Binding may have been written)."""
        ...

    def activate(self, uids: Iterable[str]) -> None:
        """Moves these pending pods to the active queue now (upstream Handle.Activate)."""
        ...

    def move_to_active_or_backoff(self, uids: Iterable[str]) -> None:
        """What turned these pods away is gone: the unschedulable ones are tried again (after
        their backoff), not left for the periodic flush."""
        ...

    def filter_nodes(
        self,
        pod: PodInfo,
        skip: str,
        only: Collection[str] | None = None,
        beside: Sequence[PodInfo] = (),
    ) -> list[NodeInfo]:
        """Every node (of `only`, when given) on which `pod` passes the profile's PreFilter and
        Filter plugins, except the plugin named `skip` (a gang plugin planning a whole gang),
        with the pods nominated to the node, and `beside`, of priority at least the pod's
        counted in (their PreFilter without `skip` too)."""
        ...

    def filter_status(self, pod: PodInfo, node_name: str) -> Status:
        """The profile's verdict on `pod` on one node: PreFilter (a node it leaves out gets
        its reason), then Filter with the pods nominated to the node."""
        ...

    def nominations(self) -> Mapping[str, Sequence[PodInfo]]:
        """Node -> pending pods nominated to it by preemption (read under the cache lock)."""
        ...

    def preempt(self, pod: PodInfo, node_name: str, victims: Sequence[PodInfo]) -> None:
        """Nominates `pod` to the node and evicts the victims (asynchronous: condition
        DisruptionTarget, deletion, events)."""
        ...

    def preemption_pending(self, pod: PodInfo) -> str | None:
        """The pod's nominated node while its preemption there waits for victims to go (its
        own, or any lower-priority pod terminating by preemption there)."""
        ...

    def get_json(self, path: str) -> dict[str, Any] | None:
        """GET an API path as JSON; None when it does not exist or there is no API client."""
        ...

    def write_json(self, method: str, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Sends `body` to an API path (PUT, POST) and returns the answer; a KubeError when
        it fails (status 0: no answer, or no API client)."""
        ...


PluginFactory = Callable[[Mapping[str, Any], Handle], Plugin]
"""`New(args, handle)`: validates typed args and builds the plugin."""
