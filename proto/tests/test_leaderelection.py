"""The shared Lease elector against the real API server: expiry timed from the observed
change (a holder with a clock far behind keeps its Lease while it renews), a Lease taken
over is lost at once, a released Lease is taken at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.leaderelection import LeaderElector, LeaseConfig
from lj_runtimekit.testkit.waits import wait_for

pytestmark = pytest.mark.controlplane

FAST = {"lease_duration_s": 2.0, "renew_deadline_s": 1.5, "retry_period_s": 0.2}


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[KubeClient]:
    client = KubeClient.connect(str(control_plane.kubeconfig_path))
    yield client
    client.close()


def _config(namespace: str, identity: str, **timing: float) -> LeaseConfig:
    return LeaseConfig(namespace, "election", identity, **{**FAST, **timing})


def _holder(kube: KubeClient, elector: LeaderElector) -> str:
    return str(kube.request("GET", elector.path)["spec"].get("holderIdentity") or "")


def _write_as(kube: KubeClient, elector: LeaderElector, holder: str, renew: datetime) -> None:
    """Renew the Lease as another process whose clock reads `renew`."""
    lease = kube.request("GET", elector.path)
    stamp = renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease["spec"].update(
        holderIdentity=holder, renewTime=stamp, acquireTime=stamp, leaseDurationSeconds=2
    )
    kube.request("PUT", elector.path, body=lease)


def test_a_holder_with_a_clock_behind_keeps_the_lease_while_it_renews(
    kube: KubeClient, namespace: str
) -> None:
    first = LeaderElector(kube, _config(namespace, "first"))
    assert first.try_acquire_or_renew()
    candidate = LeaderElector(kube, _config(namespace, "candidate"))
    skewed = datetime.now(UTC) - timedelta(seconds=20)  # the holder's clock: 20 s behind
    deadline = time.monotonic() + 5  # 2.5 lease durations
    while time.monotonic() < deadline:
        skewed += timedelta(seconds=0.5)
        _write_as(kube, first, "skewed-holder", skewed)
        seen = time.monotonic()  # the candidate sees the change no earlier than this
        assert not candidate.try_acquire_or_renew(), "took a Lease its holder renews"
        time.sleep(0.5)
    # The holder stops renewing: the Lease expires one duration after the last change seen.
    wait_for(candidate.try_acquire_or_renew, 10, "the candidate to take the expired Lease")
    assert time.monotonic() - seen >= 2.0
    assert _holder(kube, candidate) == "candidate"


def test_a_leader_whose_lease_is_taken_over_stops_at_once(kube: KubeClient, namespace: str) -> None:
    leader = LeaderElector(kube, _config(namespace, "leader", renew_deadline_s=30))
    assert leader.try_acquire_or_renew()
    stop = threading.Event()
    lost: list[bool] = []
    renewing = threading.Thread(target=lambda: lost.append(leader.renew_until_lost(stop)))
    renewing.start()
    try:
        time.sleep(0.5)
        _write_as(kube, leader, "usurper", datetime.now(UTC))
        taken = time.monotonic()
        renewing.join(5)
        assert lost == [True], "still leading after another holder took the Lease"
        assert time.monotonic() - taken < 2, "waited for the renew deadline"
    finally:
        stop.set()
        renewing.join()


def test_a_released_lease_is_taken_at_once_by_a_standby(kube: KubeClient, namespace: str) -> None:
    leader = LeaderElector(kube, _config(namespace, "leader", lease_duration_s=60))
    standby = LeaderElector(kube, _config(namespace, "standby", lease_duration_s=60))
    assert leader.try_acquire_or_renew()
    assert not standby.try_acquire_or_renew()
    leader.release()
    assert standby.try_acquire_or_renew()
    assert _holder(kube, standby) == "standby"
    assert not leader.try_acquire_or_renew()
