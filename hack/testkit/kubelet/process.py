"""Run `lj-device-plugin` as a subprocess next to a kubelet shim (tests, benchmarks, sandbox)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO


class PluginProcess:
    """A `lj-device-plugin` subprocess; `stop()` sends SIGTERM and returns the exit status."""

    def __init__(
        self,
        plugin_dir: Path,
        runtime_socket_dir: Path,
        pods_url: str,
        *,
        node_name: str = "node-1",
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.log_path = log_path or plugin_dir.with_name(plugin_dir.name + "-plugin.log")
        self.args = [
            sys.executable,
            "-m",
            "lj_runtimekit.deviceplugin.cmd.device_plugin.main",
            "--plugin-dir",
            str(plugin_dir),
            "--runtime-socket-dir",
            str(runtime_socket_dir),
            "--kubelet-pods-url",
            pods_url,
            "--node-name",
            node_name,
            "--label-node=false",
            "--log-format=text",
            *extra_args,
        ]
        self._env = {**os.environ, **(env or {})}
        self._env.pop("KUBERNETES_SERVICE_HOST", None)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> PluginProcess:
        """Start the process (it waits for kubelet.sock by itself)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self._env
        )
        return self

    @property
    def pid(self) -> int:
        """Process id of the plugin."""
        if self._proc is None:
            raise RuntimeError("plugin not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the process runs."""
        return self._proc is not None and self._proc.poll() is None

    def log(self) -> str:
        """The plugin's log so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; return its status."""
        if self._proc is None:
            raise RuntimeError("plugin not started")
        code = self._proc.wait(timeout)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; return the exit status."""
        if self._proc is None:
            raise RuntimeError("plugin not started")
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._close_log()
        return self._proc.returncode

    def __enter__(self) -> PluginProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
