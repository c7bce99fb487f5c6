"""LjSchedulerConfiguration loading: defaults, plugins, args, and each mistake named."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit.schedulerframework.cmd.scheduler import main as scheduler_main
from lj_runtimekit.schedulerframework.internal.cache.nodeinfo import NodeInfo
from lj_runtimekit.schedulerframework.internal.cache.podinfo import PodInfo
from lj_runtimekit.schedulerframework.internal.config.config import (
    ConfigError,
    load_config,
    parse_config,
)
from lj_runtimekit.schedulerframework.internal.framework.interface import (
    FilterPlugin,
    PluginError,
    check_plugin,
)
from lj_runtimekit.schedulerframework.internal.framework.runtime import EnabledPlugin, Framework
from lj_runtimekit.schedulerframework.internal.framework.types import (
    SUCCESS,
    CycleState,
    Status,
)
from lj_runtimekit.schedulerframework.internal.plugins.gpushare.plugin import Args as GpuArgs

SAMPLE = Path(__file__).parent.parent / "config" / "scheduler-config.yaml"


def test_defaults_and_sample_agree() -> None:
    default = load_config(None)
    sample = load_config(SAMPLE)
    assert default.profiles == sample.profiles
    (profile,) = default.profiles
    assert profile.scheduler_name == "lj-scheduler"
    assert [p.name for p in profile.plugins] == [
        "Coscheduling",
        "NodeUnschedulable",
        "NodeAffinity",
        "TaintToleration",
        "NodeResourcesFit",
        "DynamicResources",
        "GpuShare",
        "DeviceTopology",
        "DefaultPreemption",
        "DefaultBinder",
    ]
    assert default.leader_election.lease_duration_s == 15


def test_scheduler_name_flag_weights_and_args() -> None:
    cfg = parse_config(
        {
            "profiles": [
                {
                    "plugins": {
                        "multiPoint": {
                            "enabled": [{"name": "GpuShare", "weight": 7}],
                            "disabled": [{"name": "DeviceTopology"}],
                        }
                    },
                    "pluginConfig": [{"name": "GpuShare", "args": {"policy": "spread"}}],
                }
            ]
        },
        "x.yaml",
        scheduler_name="gpu-sched",
    )
    (profile,) = cfg.profiles
    assert profile.scheduler_name == "gpu-sched"
    plugins = {p.name: p for p in profile.plugins}
    assert "DeviceTopology" not in plugins
    assert plugins["GpuShare"].weight == 7
    assert plugins["GpuShare"].args == GpuArgs(policy="spread")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "KubeSchedulerConfiguration"}, "kind: must be LjSchedulerConfiguration"),
        ({"bogus": 1}, r"unknown fields \['bogus'\]"),
        (
            {"profiles": [{"plugins": {"multiPoint": {"enabled": [{"name": "Nope"}]}}}]},
            r"profiles\[0\]\.plugins\.multiPoint\.enabled\[0\]\.name: unknown plugin 'Nope'",
        ),
        (
            {"profiles": [{"pluginConfig": [{"name": "GpuShare", "args": {"policy": "tight"}}]}]},
            "pluginConfig GpuShare: args.policy must be one of binpack, spread, got 'tight'",
        ),
        (
            {"profiles": [{"pluginConfig": [{"name": "GpuShare", "args": {"polcy": "x"}}]}]},
            r"unknown args \['polcy'\]",
        ),
        (
            {"profiles": [{"plugins": {"multiPoint": {"disabled": [{"name": "*"}]}}}]},
            "no bind plugin enabled",
        ),
        (
            {
                "profiles": [
                    {"plugins": {"multiPoint": {"disabled": [{"name": "DynamicResources"}]}}}
                ]
            },
            r"profiles\[0\]\.plugins: DynamicResources disabled: pods with ResourceClaims",
        ),
        ({"profiles": [{}, {}]}, "duplicate schedulerName"),
        (
            {"leaderElection": {"leaseDuration": "5s", "renewDeadline": "10s"}},
            "retryPeriod < renewDeadline < leaseDuration",
        ),
        ({"leaderElection": {"retryPeriod": "soon"}}, "must be a positive duration"),
        ({"percentageOfNodesToScore": 150}, "must be 0..100"),
        ({"clientConnection": {"qps": -1}}, r"clientConnection\.qps: must be a number"),
        ({"bindWorkers": 0}, r"config\.bindWorkers: must be an integer >= 1"),
    ],
)
def test_mistakes_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(data, "sched.yaml")
    assert str(info.value).startswith("sched.yaml: ")


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    two = tmp_path / "two.yaml"
    two.write_text("profiles: [{schedulerName: a}, {schedulerName: b}]\n")
    with pytest.raises(ConfigError, match="--scheduler-name renames the profile"):
        load_config(two, scheduler_name="x")


@pytest.mark.parametrize(
    ("argv", "env", "flag"),
    [
        (["--metrics-port=70000"], {}, "--metrics-port"),
        (["--extender-port=http"], {}, "--extender-port"),
        ([], {"LJ_SCHEDULER_METRICS_PORT": "abc"}, "--metrics-port"),
        (["--mode=both"], {}, "--mode"),
    ],
)
def test_flag_mistakes_are_one_line_naming_the_flag(
    argv: list[str],
    env: dict[str, str],
    flag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exited:
        scheduler_main.main(argv)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("lj-scheduler: error: ")
    assert flag in line


class _Named:
    name = "Probe"


class _Filter(_Named, FilterPlugin):
    def filter(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        return SUCCESS


class _Misspelled(_Named, FilterPlugin):
    def filtre(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> Status:
        return SUCCESS


class _Undeclared(_Filter):
    def score(self, state: CycleState, pod: PodInfo, node: NodeInfo) -> int:
        return 0


class _NearMiss(_Filter):
    def pre_filer(self, state: CycleState, pod: PodInfo) -> None:
        return None


def test_plugins_declare_and_implement_their_extension_points() -> None:
    """A plugin's extension points are its Protocol base classes, checked when a profile
    is built: a misspelled or undeclared point stops the start instead of being skipped."""
    check_plugin(_Filter())  # the in-tree plugins pass it in every scheduler the tests build
    with pytest.raises(PluginError, match="declares FilterPlugin but does not implement filter"):
        check_plugin(_Misspelled())  # type: ignore[abstract]
    with pytest.raises(PluginError, match="defines score but does not declare ScorePlugin"):
        check_plugin(_Undeclared())
    with pytest.raises(
        PluginError, match="pre_filer is not an extension point; did you mean pre_filter"
    ):
        check_plugin(_NearMiss())
    with pytest.raises(PluginError, match="declares no extension point"):
        check_plugin(_Named())
    with pytest.raises(PluginError, match="Probe"):
        Framework("lj-scheduler", [EnabledPlugin(_Undeclared())], handle=None)  # type: ignore[arg-type]
