"""The in-tree plugin registry: name -> (args parser, factory), like upstream's registry.go.

Out-of-tree plugins (the gang issue's Coscheduling) are added here by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lj_runtimekit.schedulerframework.internal.framework.interface import Handle, Plugin
from lj_runtimekit.schedulerframework.internal.plugins import (
    defaultbinder,
    defaultpreemption,
    devicetopology,
    dynamicresources,
    nodeaffinity,
    noderesources,
    nodeunschedulable,
    tainttoleration,
)
from lj_runtimekit.schedulerframework.internal.plugins.coscheduling import plugin as coscheduling
from lj_runtimekit.schedulerframework.internal.plugins.gpushare import plugin as gpushare


@dataclass(frozen=True)
class Registration:
    """How to validate a plugin's args (at config load) and build it (at start)."""

    parse_args: Callable[[Mapping[str, Any]], object]
    factory: Callable[[Any, Handle], Plugin]


REGISTRY: dict[str, Registration] = {
    nodeunschedulable.NAME: Registration(nodeunschedulable.Args.parse, nodeunschedulable.new),
    dynamicresources.NAME: Registration(dynamicresources.Args.parse, dynamicresources.new),
    tainttoleration.NAME: Registration(tainttoleration.Args.parse, tainttoleration.new),
    nodeaffinity.NAME: Registration(nodeaffinity.Args.parse, nodeaffinity.new),
    noderesources.NAME: Registration(noderesources.Args.parse, noderesources.new),
    gpushare.NAME: Registration(gpushare.Args.parse, gpushare.new),
    devicetopology.NAME: Registration(devicetopology.Args.parse, devicetopology.new),
    defaultbinder.NAME: Registration(defaultbinder.Args.parse, defaultbinder.new),
    coscheduling.NAME: Registration(coscheduling.Args.parse, coscheduling.new),
    defaultpreemption.NAME: Registration(defaultpreemption.Args.parse, defaultpreemption.new),
}

DEFAULT_PLUGINS: tuple[tuple[str, int], ...] = (
    (coscheduling.NAME, 0),  # first: its PreFilter narrows gang members to their planned nodes
    (nodeunschedulable.NAME, 0),
    (nodeaffinity.NAME, 2),  # scores preferred node affinity (upstream's weight)
    (tainttoleration.NAME, 3),  # scores PreferNoSchedule taints (upstream's weight)
    (noderesources.NAME, 1),
    # after the cheap filters (it allocates claims on each node it judges), before GpuShare
    # (it says why a DRA node is left out); scores fuller nodes first (binpack)
    (dynamicresources.NAME, 1),
    (gpushare.NAME, 3),
    (devicetopology.NAME, 2),
    (defaultpreemption.NAME, 0),
    (defaultbinder.NAME, 0),
)
"""The default profile: (plugin, score weight), filters in this order."""
