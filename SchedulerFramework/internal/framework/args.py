"""Validation helpers for typed plugin args (frozen dataclasses built at config load)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


class ArgsError(ValueError):
    """Invalid plugin args; the message names the plugin and the field."""


def check_fields(plugin: str, raw: Mapping[str, Any], allowed: Collection[str]) -> None:
    if not isinstance(raw, Mapping):
        raise ArgsError(f"pluginConfig {plugin}: args must be a mapping, got {raw!r}")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ArgsError(
            f"pluginConfig {plugin}: unknown args {unknown}; known: {sorted(allowed) or 'none'}"
        )


def choice(
    plugin: str, raw: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str
) -> str:
    value = raw.get(key, default)
    if value not in allowed:
        raise ArgsError(
            f"pluginConfig {plugin}: args.{key} must be one of {', '.join(allowed)}, got {value!r}"
        )
    return str(value)


def boolean(plugin: str, raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ArgsError(f"pluginConfig {plugin}: args.{key} must be true or false, got {value!r}")
    return value


def string(plugin: str, raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ArgsError(f"pluginConfig {plugin}: args.{key} must be a string, got {value!r}")
    return value
