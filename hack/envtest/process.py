"""Child processes of the control plane: own session, log file, group teardown."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux prctl), so that a
    test runner killed without teardown (timeout, SIGKILL) leaves no control plane behind.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ProcessExitedError(RuntimeError):
    """A component died while it was expected to run; the message has its log tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    """Last lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Process:
    """One component, started in its own session so that its whole group can be killed."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, die_with_parent: bool = True
    ) -> None:
        """`die_with_parent` (Linux): the process gets SIGKILL when the thread that started
        it exits, so start it from a thread that lives as long as the process should."""
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.die_with_parent = die_with_parent and sys.platform == "linux"
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"# {' '.join(self.argv)}\n".encode())
            log.flush()
            preexec: Callable[[], None] | None = _die_with_parent if self.die_with_parent else None
            # preexec_fn only calls prctl (async-signal-safe enough between fork and exec).
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def check_running(self) -> None:
        """Raises ProcessExitedError with the log tail when the process has exited."""
        if self._popen is None:
            raise ProcessExitedError(f"{self.name} was never started")
        code = self._popen.poll()
        if code is not None:
            raise ProcessExitedError(
                f"{self.name} exited with status {code}; last lines of {self.log_path}:\n"
                f"{log_tail(self.log_path)}"
            )

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after `grace_s`."""
        popen = self._popen
        if popen is None:
            return
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while popen.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        # The leader may be gone while children of its group live on.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)
