"""Device kinds: the one table of what each Runtime device kind is called and offered as."""

from lj_runtimekit.proto.pkg.devicekind.table import (
    KINDS,
    UNKNOWN,
    DeviceKind,
    by_name,
    by_value,
    kinds,
    name_of,
    names,
    resource_names,
    whole_resources,
)

__all__ = [
    "KINDS",
    "UNKNOWN",
    "DeviceKind",
    "by_name",
    "by_value",
    "kinds",
    "name_of",
    "names",
    "resource_names",
    "whole_resources",
]
