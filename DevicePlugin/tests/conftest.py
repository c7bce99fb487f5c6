"""Fixtures: a short socket directory and a node bed factory."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest

from lj_runtimekit.testkit.kubelet.bed import (
    CORE,
    GPU,
    MEMORY,
    Bed,
    BedError,
    node_bed,
)

BedFactory = Callable[..., contextlib.AbstractAsyncContextManager[Bed]]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory for unix sockets (paths stay under ~100 characters)."""
    path = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_bed(workdir: Path) -> BedFactory:
    """Start a bed for an example node; the plugin is registered and listed when it yields."""

    @contextlib.asynccontextmanager
    async def factory(
        node: str = "tdm-8gpu",
        *,
        version: str | None = None,
        plugin_args: Sequence[str] = (),
        wait_for: Sequence[str] = (GPU, CORE, MEMORY),
    ) -> AsyncIterator[Bed]:
        try:
            async with node_bed(
                workdir, node, version=version, plugin_args=plugin_args, wait_for=wait_for
            ) as bed:
                yield bed
                assert bed.plugin.running, bed.fail("plugin exited during the test")
        except BedError as exc:
            pytest.fail(str(exc))

    return factory
