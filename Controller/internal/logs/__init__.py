"""Logging of the Controller and the Job Agent: constant messages with key=value fields."""

from lj_runtimekit.controller.internal.logs.setup import JsonFormatter, KeyValueFormatter, setup

__all__ = ["JsonFormatter", "KeyValueFormatter", "setup"]
