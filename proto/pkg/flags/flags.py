"""Flag parsing of every component's command.

A wrong flag is an operator mistake: one line on stderr that names the flag
and the value, no usage dump and no traceback, and a fixed exit status.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("auto", "json", "text")
PROTOCOL_FLAG = "--protocol-file"
PROTOCOL_ENV = "LJ_PROTOCOL_FILE"
"""The protocol.yaml flag and its environment variable: one name in every component."""


class _OldFlag(argparse.Action):
    """An earlier name of a flag: stores like it, with a one-line deprecation warning."""

    def __init__(self, *args: Any, replacement: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replacement = replacement

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        _warn(parser.prog, f"{option_string} is deprecated; use {self.replacement}")
        setattr(namespace, self.dest, values)


def _warn(prog: str, message: str) -> None:
    print(f"{prog}: warning: {message}", file=sys.stderr)


class FlagParser(argparse.ArgumentParser):
    """argparse with one-line errors: `<prog>: error: <message> (see --help)`."""

    def __init__(self, *args: Any, error_status: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_status = error_status
        """exit status of a flag mistake (1 unless a command documents another)"""
        self._old_env_used: list[tuple[str, str]] = []

    def error(self, message: str) -> NoReturn:
        line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
        print(f"{self.prog}: error: {line} (see --help)", file=sys.stderr)
        sys.exit(self.error_status)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, after a warning line per deprecated environment variable in use."""
        for old, new in self._old_env_used:
            _warn(self.prog, f"{old} is deprecated; use {new}")
        return super().parse_known_args(args, namespace)

    def env_flag(
        self,
        flag: str,
        env: str | Sequence[str],
        default: object,
        help: str,
        *,
        shown: str | None = None,
        old_flags: Sequence[str] = (),
        old_env: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        """Add `flag`, mirrored by the environment: the flag wins, then the first variable
        of `env` that is set (also when empty), then `default`. The help ends with
        `(env NAME, default VALUE)`; `shown` replaces VALUE (e.g. "the host name"). An
        environment value is a string: argparse converts it with `type` and reports a bad
        one like a bad flag. `old_flags` and `old_env` are earlier names, still read (after
        the current ones), each with a one-line deprecation warning on stderr when used."""
        names = (env,) if isinstance(env, str) else tuple(env)
        value = next((os.environ[n] for n in names if n in os.environ), None)
        old = next((n for n in old_env if n in os.environ), None)
        if value is None and old is not None:
            value = os.environ[old]
            self._old_env_used.append((old, names[0]))
        text = shown if shown is not None else ("none" if default is None else str(default))
        action = self.add_argument(
            flag,
            default=default if value is None else value,
            help=f"{help} (env {' or '.join(names)}, default {text})",
            **kwargs,
        )
        for name in old_flags:
            self.add_argument(
                name,
                dest=action.dest,
                action=_OldFlag,
                replacement=flag,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
                **kwargs,
            )

    def protocol_flag(
        self, help: str, *, old_flags: Sequence[str] = (), old_env: Sequence[str] = ()
    ) -> None:
        """`--protocol-file` (env `LJ_PROTOCOL_FILE`), the protocol.yaml of every component;
        `old_flags`/`old_env`: the component's earlier names (see `env_flag`)."""
        self.env_flag(
            PROTOCOL_FLAG,
            PROTOCOL_ENV,
            None,
            help,
            shown="the built-in names",
            old_flags=old_flags,
            old_env=old_env,
        )

    def log_flags(self, env_prefix: str, *, level: bool = True, fmt: bool = True) -> None:
        """`--log-level` and `--log-format` (each unless turned off here), mirrored by
        `<env_prefix>LOG_LEVEL` and `<env_prefix>LOG_FORMAT`."""
        if level:
            self.env_flag(
                "--log-level",
                f"{env_prefix}LOG_LEVEL",
                "INFO",
                "log level",
                type=str.upper,
                choices=LOG_LEVELS,
            )
        if not fmt:
            return
        self.env_flag(
            "--log-format",
            f"{env_prefix}LOG_FORMAT",
            "auto",
            "JSON lines, readable text, or auto (text on a terminal, JSON otherwise)",
            choices=LOG_FORMATS,
        )


def boolean(text: str) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false)")


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: off or any, as the flag says)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port in 0..65535")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value
