"""Logging of every component: constant messages plus fields (`extra={...}`).

JSON lines in production, key=value on a TTY:

_log.info("job created", extra={"node": "gpu-1", "job": "kube-system/lj-..."})
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


_KOPF_EXTRAS = frozenset({"settings", "k8s_skip", "k8s_ref"})


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra` fields of a record, in insertion order (kopf's object reference becomes
    `object=kind/namespace/name`, its other internals are dropped)."""
    out = {
        k: v
        for k, v in record.__dict__.items()
        if k not in _STANDARD and k not in _KOPF_EXTRAS and not k.startswith("_")
    }
    ref = record.__dict__.get("k8s_ref")
    if isinstance(ref, dict):
        parts = (ref.get("kind"), ref.get("namespace"), ref.get("name"))
        out["object"] = "/".join(str(p) for p in parts if p)
    return out


class KeyValueFormatter(logging.Formatter):
    """`time level logger message key=value ...` (values with spaces are quoted)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={_quote(v)}" for k, v in fields(record).items())
        return f"{line} {extra}" if extra else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _quote(value: object) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=\n')) else text


FORMATS = ("auto", "json", "text")
"""Values of every component's `--log-format` flag."""

_CHATTY = ("kopf", "urllib3", "kubernetes")


def setup(level: str, fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure the root logger: `fmt` is json, text or auto (text on a TTY).

    Client libraries (kopf logs every handler call at INFO, urllib3, the
    kubernetes client) only log their warnings unless the level is DEBUG.
    """
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if use_json else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _CHATTY:
        logging.getLogger(name).setLevel("DEBUG" if level.upper() == "DEBUG" else "WARNING")
