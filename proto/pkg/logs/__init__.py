"""Logging set-up shared by every component: JSON lines, or key=value on a TTY."""

from lj_runtimekit.proto.pkg.logs.logs import FORMATS, JsonFormatter, KeyValueFormatter, setup

__all__ = ["FORMATS", "JsonFormatter", "KeyValueFormatter", "setup"]
