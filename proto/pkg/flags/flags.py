"""Flag parsing of every component's command.

A wrong flag is an operator mistake: one line on stderr that names the flag
and the value, no usage dump and no traceback, and a fixed exit status.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, NoReturn


class FlagParser(argparse.ArgumentParser):
    """argparse with one-line errors: `<prog>: error: <message> (see --help)`."""

    def __init__(self, *args: Any, error_status: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_status = error_status
        """exit status of a flag mistake (1 unless a command documents another)"""

    def error(self, message: str) -> NoReturn:
        line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
        print(f"{self.prog}: error: {line} (see --help)", file=sys.stderr)
        sys.exit(self.error_status)


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
