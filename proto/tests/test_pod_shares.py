"""What a pod holds per device (`pod_shares`), and the Kubernetes peak rule it follows."""

from __future__ import annotations

from lj_runtimekit.proto.pkg.protocol import DeviceShare, pod_shares
from lj_runtimekit.proto.pkg.protocol.assignment import peak_use


def test_peak_counts_sidecars_declared_before_an_init_container() -> None:
    """Kubernetes runs a restartable init container (sidecar) beside every init container
    declared after it: the peak is per init container its use plus the sidecars' before it,
    and all sidecars with all app containers."""
    # sidecar 2, init 3 (runs beside it), sidecar 1, init 2 (beside both), apps 1 + 1
    init = [(True, {"g": 2}), (False, {"g": 3}), (True, {"g": 1}), (False, {"g": 2})]
    apps = [{"g": 1}, {"g": 1, "cpu": 5}]
    assert peak_use(init, apps) == {"g": 5, "cpu": 5}  # max(2+3, 3+2, 3+2)
    # an init container declared before the sidecar does not run beside it
    assert peak_use([(False, {"g": 3}), (True, {"g": 2})], [{"g": 1}]) == {"g": 3}
    assert peak_use([], [{"g": 1}, {"g": 2}]) == {"g": 3}


def test_a_sidecar_before_an_init_container_adds_to_its_slice() -> None:
    assignment = {
        "side": (DeviceShare("g0", 20, 10),),
        "prep": (DeviceShare("g0", 50, 60),),
        "main": (DeviceShare("g0", 30, 30),),
    }
    before = pod_shares(assignment, [("side", True), ("prep", False)])
    assert before == (DeviceShare("g0", 70, 70),)  # sidecar + init: max(20+50, 20+30)
    after = pod_shares(assignment, [("prep", False), ("side", True)])
    assert after == (DeviceShare("g0", 50, 60),)  # max(50, 20+30), max(60, 10+30)


def test_whole_devices_are_listed_once() -> None:
    assignment = {
        "side": (DeviceShare("g0"),),
        "prep": (DeviceShare("g1"), DeviceShare("g2")),
        "main": (DeviceShare("g1"), DeviceShare("g3", 10, 10)),
    }
    got = pod_shares(assignment, [("side", True), ("prep", False)])
    whole = [DeviceShare("g0"), DeviceShare("g1"), DeviceShare("g2")]
    assert sorted(got) == [*whole, DeviceShare("g3", 10, 10)]
