"""The Runtime client's behaviour when no Runtime serves the socket."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from lj_runtimekit.proto.pkg.runtimeclient import (
    RetryPolicy,
    RuntimeClient,
    RuntimeUnavailableError,
)


async def test_absent_runtime_is_a_clear_bounded_error() -> None:
    socket_dir = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    policy = RetryPolicy(attempts=3, max_delay_s=5.0, initial_backoff_s=0.05, call_timeout_s=1.0)
    started = time.monotonic()
    async with RuntimeClient(socket_dir, retry=policy) as client:
        with pytest.raises(RuntimeUnavailableError) as excinfo:
            await client.list_devices()
    elapsed = time.monotonic() - started
    message = str(excinfo.value)
    assert str(socket_dir / "runtime.sock") in message
    assert "the file does not exist" in message
    assert "after 3 attempts" in message
    assert elapsed < policy.max_delay_s + policy.call_timeout_s


def test_default_socket_is_the_runtime_directory() -> None:
    client = RuntimeClient()
    assert client.target == "unix:///run/amp/eKitC/xdm/sockets/runtime.sock"
