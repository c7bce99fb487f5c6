"""Fixtures of the Scheduler Framework tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from lj_runtimekit.schedulerframework.internal.schedtesting.fake import FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster()
    yield c
    c.scheduler.stop()


@pytest.fixture
def make_cluster() -> Iterator[Callable[[Mapping[str, Any] | None], FakeCluster]]:
    made: list[FakeCluster] = []

    def make(config: Mapping[str, Any] | None = None) -> FakeCluster:
        c = FakeCluster(config)
        made.append(c)
        return c

    yield make
    for c in made:
        c.scheduler.stop()
