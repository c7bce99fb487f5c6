"""The Controller's feature client through the shared RuntimeClient, against the simulator."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lj_runtimekit.controller.pkg.featureclient import (
    disable_features,
    enable_features,
    feature_state,
)
from lj_runtimekit.proto.pkg.runtimeclient import (
    RetryPolicy,
    RuntimeClient,
    RuntimeUnavailableError,
)
from lj_runtimekit.runtimesim.process import EXAMPLE_NODES, SimulatorProcess

FAST = RetryPolicy(attempts=3, max_delay_s=2.0, initial_backoff_s=0.05, max_backoff_s=0.2)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    yield path / "s"
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sim(socket_dir: Path) -> Iterator[SimulatorProcess]:
    with SimulatorProcess(socket_dir, EXAMPLE_NODES / "tdm-8gpu.yaml") as process:
        yield process


async def test_switch_and_read_the_features(sim: SimulatorProcess) -> None:
    async with RuntimeClient(sim.socket_dir, retry=FAST) as client:
        assert (await feature_state(client)).enabled is False
        on = await enable_features(client, "job-1")
        assert (on.enabled, on.changed, on.changed_by) == (True, True, "job-1")
        assert (await enable_features(client, "job-2")).changed is False
        state = await feature_state(client)
        assert (state.enabled, state.changed_by) == (True, "job-1")
        off = await disable_features(client, "job-3")
        assert (off.enabled, off.changed) == (False, True)


async def test_an_absent_runtime_is_the_shared_clients_error(socket_dir: Path) -> None:
    async with RuntimeClient(socket_dir, retry=FAST) as client:
        with pytest.raises(RuntimeUnavailableError, match="after 3 attempts"):
            await feature_state(client)
