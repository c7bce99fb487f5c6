"""The stock kube-scheduler places DRA claims exactly on our ResourceSlices and DeviceClasses.

A control plane of the DRA mode's release (DRA_VERSION, its parts on by default), three KWOK
nodes in DRA mode (the simulator's example inventories published as slices), the
DeviceClasses of classes.py; pods with ResourceClaimTemplates are scheduled by kube-
scheduler and run by KWOK. Every allocation is read back into Runtime shares (naming.py),
and after every test the claims of the whole cluster are checked against the sharing
invariant.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lj_runtimekit.deviceplugin.internal.dra.classes import profile_selector
from lj_runtimekit.deviceplugin.internal.dra.naming import CORES, MEMORY, memory_step
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.protocol import DeviceShare, load_protocol
from lj_runtimekit.testkit.dra import (
    DraSpace,
    Share,
    exactly,
    example_devices,
)

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

PROTOCOL = load_protocol()
DRIVER = PROTOCOL.dra.driver
WHOLE = PROTOCOL.dra.whole_class("gpu")
SHARE = PROTOCOL.dra.share_class("gpu")
MIG = PROTOCOL.dra.mig_class


def _memory(percent: int) -> str:
    """Bytes of `percent` % of an example GPU's memory, in the slices' 1 % steps."""
    return str(percent * memory_step(example_devices("tdm-8gpu")[0]))


def _percents(shares: Sequence[Share]) -> list[tuple[int, int]]:
    return [(s.core_percent, s.memory_percent) for _, _, s in shares]


def test_whole_gpus(dra_space: DraSpace) -> None:
    pod = dra_space.run("whole", {"gpus": [exactly("g", WHOLE, count=2)]}, node="dra-tdm")
    (shares,) = dra_space.claims_of(pod).values()
    assert len({ref.runtime_id for _, ref, _ in shares}) == 2
    for _, ref, share in shares:
        assert share == DeviceShare(ref.device.id)
        assert ref.device.kind == pb.DEVICE_KIND_GPU


def test_tdm_slices_pack_one_gpu(dra_space: DraSpace) -> None:
    pod = dra_space.run(
        "slices",
        {
            "both": [exactly("s", SHARE, capacity={CORES: "30", MEMORY: _memory(25)})],
            "cores": [exactly("s", SHARE, capacity={CORES: "40", MEMORY: "0"})],
            "memory": [exactly("s", SHARE, capacity={CORES: "0", MEMORY: _memory(10)})],
            "rest": [exactly("s", SHARE, capacity={CORES: "30", MEMORY: _memory(65)})],
        },
        containers=({"main": ("both", "cores", "memory", "rest")},),
        node="dra-tdm",
    )
    claims = dra_space.claims_of(pod)
    assert {name: _percents(shares) for name, shares in claims.items()} == {
        "both": [(30, 25)],
        "cores": [(40, 0)],
        "memory": [(0, 10)],
        "rest": [(30, 65)],
    }
    # Each slice on a TDM GPU, all four on the same one: it is full now.
    devices = {ref.device.id for shares in claims.values() for _, ref, _ in shares}
    assert len(devices) == 1
    for shares in claims.values():
        for _, ref, _ in shares:
            assert ref.device.mode == pb.DEVICE_MODE_TDM


def test_mig_instances_by_profile_beside_a_tdm_slice(dra_space: DraSpace) -> None:
    dra_space.run(
        "slice",
        {"s": [exactly("s", SHARE, capacity={CORES: "50", MEMORY: _memory(50)})]},
        node="dra-mig",
    )
    pod = dra_space.run(
        "mig",
        {
            "small": [exactly("m", MIG, count=2, selector=profile_selector(PROTOCOL, "1g.10gb"))],
            "large": [exactly("m", MIG, selector=profile_selector(PROTOCOL, "4g.40gb"))],
        },
        containers=({"main": ("small", "large")},),
    )
    claims = dra_space.claims_of(pod)
    assert pod["spec"]["nodeName"] == "dra-mig"
    small = [ref for _, ref, _ in claims["small"]]
    (large,) = [ref for _, ref, _ in claims["large"]]
    assert [r.instance.profile if r.instance else None for r in small] == ["1g.10gb"] * 2
    assert {r.device.index for r in small} == {6}
    assert large.instance is not None
    assert large.instance.profile == "4g.40gb"
    assert large.device.index == 7
    assert all(s.whole for _, _, s in claims["small"] + claims["large"])


def test_ppus_on_one_nvlink_pair(dra_space: DraSpace) -> None:
    dra_space.template(
        "pair",
        [exactly("p", PROTOCOL.dra.whole_class("ppu"), count=2)],
        constraints=[{"requests": ["p"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}],
    )
    dra_space.pod("ppu", {"p": "pair"}, containers=({"main": ("p",)},))
    pod = dra_space.running("ppu")
    (shares,) = dra_space.claims_of(pod).values()
    assert pod["spec"]["nodeName"] == "dra-ppu"
    first, second = sorted(ref.device.index for _, ref, _ in shares)
    assert first % 2 == 0
    assert second == first + 1
    assert all(ref.device.kind == pb.DEVICE_KIND_PPU for _, ref, _ in shares)


def test_containers_share_one_claim_and_init_containers_have_theirs(dra_space: DraSpace) -> None:
    pod = dra_space.run(
        "shared",
        {"half": [exactly("s", SHARE, capacity={CORES: "50", MEMORY: _memory(50)})]},
        containers=({"a": ("half",)}, {"b": ("half",)}),
        node="dra-tdm",
    )
    (shares,) = dra_space.claims_of(pod).values()
    assert _percents(shares) == [(50, 50)]

    pod = dra_space.run(
        "init",
        {
            "setup": [exactly("s", SHARE, capacity={CORES: "20", MEMORY: _memory(10)})],
            "work": [exactly("s", SHARE, capacity={CORES: "30", MEMORY: _memory(40)})],
        },
        init_containers=({"setup": ("setup",)},),
        containers=({"main": ("work",)},),
        node="dra-tdm",
    )
    claims = dra_space.claims_of(pod)
    assert _percents(claims["setup"]) == [(20, 10)]
    assert _percents(claims["work"]) == [(30, 40)]


def test_extended_resource_without_a_claim(dra_space: DraSpace) -> None:
    dra_space.pod("extended", {}, limits={PROTOCOL.resources.gpu: "1"})
    pod = dra_space.running("extended")
    (shares,) = dra_space.claims_of(pod).values()
    ((pool, ref, share),) = shares
    assert pool in ("dra-tdm", "dra-mig")
    assert ref.device.kind == pb.DEVICE_KIND_GPU
    assert share.whole


def test_extended_mig_profile_without_a_claim(dra_space: DraSpace) -> None:
    """A pod asking `<mig prefix>/mig-<profile>: 1` without a claim gets one MIG instance of
    that profile (its class names the resource); two pods never get the same instance: with
    the profile's only instance taken, the second pod stays pending."""
    small = PROTOCOL.resources.mig("1g.10gb")
    for name in ("small-a", "small-b"):
        dra_space.pod(name, {}, limits={small: "1"})
    instances = []
    for name in ("small-a", "small-b"):
        pod = dra_space.running(name)
        (shares,) = dra_space.claims_of(pod).values()
        ((pool, ref, share),) = shares
        assert pool == "dra-mig"
        assert ref.instance is not None
        assert ref.instance.profile == "1g.10gb"
        assert share.whole
        instances.append(ref.runtime_id)
    assert len(set(instances)) == 2, instances

    large = PROTOCOL.resources.mig("4g.40gb")
    for name in ("large-a", "large-b"):
        dra_space.pod(name, {}, limits={large: "1"})
    pods = [dra_space.settled(name) for name in ("large-a", "large-b")]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(running) == 1, [p["status"] for p in pods]
    ((_, ref, _),) = next(iter(dra_space.claims_of(running[0]).values()))
    assert ref.instance is not None
    assert ref.instance.profile == "4g.40gb"
    (pending,) = [p for p in pods if p not in running]
    (condition,) = [c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["reason"] == "Unschedulable"


def test_a_pod_that_cannot_fit_stays_pending(dra_space: DraSpace) -> None:
    dra_space.template("many", [exactly("g", WHOLE, count=15)])
    dra_space.pod("many", {"g": "many"}, containers=({"main": ("g",)},))
    pod = dra_space.settled("many")
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in condition["message"]
    assert "nodeName" not in pod["spec"]


def test_bursts_fill_mig_instances_and_ppu_pairs_exactly(dra_space: DraSpace) -> None:
    profiles = ["1g.10gb"] * 8 + ["3g.40gb", "4g.40gb"]
    for n, profile in enumerate(profiles):
        dra_space.template(
            f"mig-{n}", [exactly("m", MIG, selector=profile_selector(PROTOCOL, profile))]
        )
    pair = {"constraints": [{"requests": ["p"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}]}
    dra_space.template("pair", [exactly("p", PROTOCOL.dra.whole_class("ppu"), count=2)], **pair)
    for n in range(len(profiles)):
        dra_space.pod(f"mig-{n}", {"m": f"mig-{n}"}, containers=({"main": ("m",)},))
    for n in range(9):
        dra_space.pod(f"ppu-{n}", {"p": "pair"}, containers=({"main": ("p",)},))
    pods = [dra_space.settled(f"mig-{n}") for n in range(len(profiles))]
    pods += [dra_space.settled(f"ppu-{n}") for n in range(9)]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    pending = sorted(p["metadata"]["name"] for p in pods if p not in running)
    # Seven 1g.10gb instances for eight pods; eight PPU pairs for nine.
    assert len(pending) == 2
    assert pending[0].startswith("mig-")
    assert pending[1].startswith("ppu-")
    used = [
        ref for p in running for shares in dra_space.claims_of(p).values() for _, ref, _ in shares
    ]
    mig = sorted(r.runtime_id for r in used if r.instance is not None)
    everything = dra_space.cluster.inventories["dra-mig"]
    assert mig == sorted(i.id for d in everything for i in d.mig_instances)
    ppus = sorted(r.runtime_id for r in used if r.device.kind == pb.DEVICE_KIND_PPU)
    assert ppus == sorted(d.id for d in dra_space.cluster.inventories["dra-ppu"])


def test_two_pods_with_a_whole_gpu_each_share_a_node(dra_space: DraSpace) -> None:
    dra_space.run("first", {"g": [exactly("g", WHOLE)]}, node="dra-tdm")
    dra_space.template("g", [exactly("g", WHOLE)])
    dra_space.pod("second", {"g": "g"}, containers=({"main": ("g",)},), node="dra-tdm")
    assert dra_space.settled("second")["status"].get("phase") == "Running"


def test_a_slice_that_does_not_fit_the_first_gpu_goes_to_another(dra_space: DraSpace) -> None:
    dra_space.run(
        "first",
        {"s": [exactly("s", SHARE, capacity={CORES: "60", MEMORY: _memory(60)})]},
        node="dra-tdm",
    )
    dra_space.template("s", [exactly("s", SHARE, capacity={CORES: "60", MEMORY: _memory(60)})])
    dra_space.pod("second", {"s": "s"}, containers=({"main": ("s",)},), node="dra-tdm")
    assert dra_space.settled("second")["status"].get("phase") == "Running"
