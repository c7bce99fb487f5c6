"""The protocol file through each component's real command line and lj-deploy's.

Every component names its protocol file `--protocol-file` (environment `LJ_PROTOCOL_FILE`);
the earlier names are still read, with a one-line deprecation warning. A file that cannot be
used stops each command with exit status 1 and one line naming the keys and the file, never a
traceback. A broken file is what shows which file a command read: it fails on that one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lj_runtimekit.proto.pkg.protocol import DEFAULTS

BIN = Path(sys.executable).parent
COMMANDS = {
    "lj-device-plugin": ["--kubelet-pods-url=http://127.0.0.1:1/pods", "--label-node=false"],
    "lj-scheduler": [],
    "lj-exporter": [],
    "lj-deploy": ["render", "--version=v1.0.0"],
}
CORE = DEFAULTS["resources.core"]
COLLISION = f"resources.gpu: {CORE}\n"
COLLISION_LINE = f"keys 'resources.gpu' and 'resources.core' both name {CORE!r}; each needs its own"


def run(command: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Exit status and the output lines (stdout and stderr) of one command."""
    clean = {k: v for k, v in os.environ.items() if "PROTOCOL" not in k}
    done = subprocess.run(
        [str(BIN / command), *COMMANDS[command], *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()


def refused(code: int, lines: list[str], *needles: str) -> str:
    """The one line naming every needle; the command exited 1 without a traceback."""
    assert code == 1, lines
    assert not any("Traceback" in line for line in lines), lines
    matching = [line for line in lines if all(n in line for n in needles)]
    assert len(matching) == 1, lines
    return matching[0]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "protocol.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", ["lj-device-plugin", "lj-scheduler", "lj-exporter"])
def test_each_component_refuses_colliding_keys_by_the_one_flag(
    tmp_path: Path, command: str
) -> None:
    path = write(tmp_path, COLLISION)
    code, lines = run(command, f"--protocol-file={path}")
    assert lines == [refused(code, lines, str(path), COLLISION_LINE)]
    # The same file by the one environment variable.
    code, lines = run(command, env={"LJ_PROTOCOL_FILE": str(path)})
    assert lines == [refused(code, lines, str(path), COLLISION_LINE)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            f"annotations.bind_phase: {DEFAULTS['annotations.assigned_devices']}\n",
            "keys 'annotations.assigned_devices' and 'annotations.bind_phase' both name",
        ),
        ("labels.enable: a\nlabels.enable: b\n", "key 'labels.enable' is given twice"),
        ("# nothing set\n", "the protocol file has no keys"),
    ],
)
def test_lj_deploy_refuses_what_the_components_refuse(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    code, lines = run("lj-deploy", f"--protocol={path}")
    line = refused(code, lines, str(path), message)
    assert line.startswith("error: "), line


@pytest.mark.parametrize(
    ("command", "args", "env", "warning"),
    [
        (
            "lj-device-plugin",
            ["--protocol={path}"],
            {},
            "lj-device-plugin: warning: --protocol is deprecated; use --protocol-file",
        ),
        (
            "lj-scheduler",
            [],
            {"LJ_SCHEDULER_PROTOCOL_FILE": "{path}"},
            "lj-scheduler: warning: LJ_SCHEDULER_PROTOCOL_FILE is deprecated; use LJ_PROTOCOL_FILE",
        ),
        (
            "lj-exporter",
            [],
            {"LJ_EXPORTER_PROTOCOL_FILE": "{path}"},
            "lj-exporter: warning: LJ_EXPORTER_PROTOCOL_FILE is deprecated; use LJ_PROTOCOL_FILE",
        ),
    ],
)
def test_the_old_names_still_work_with_a_deprecation_line(
    tmp_path: Path, command: str, args: list[str], env: dict[str, str], warning: str
) -> None:
    path = write(tmp_path, COLLISION)
    code, lines = run(
        command,
        *(a.format(path=path) for a in args),
        env={k: v.format(path=path) for k, v in env.items()},
    )
    refused(code, lines, str(path), COLLISION_LINE)
    assert [line for line in lines if "deprecated" in line] == [warning]


def test_the_new_name_wins_over_the_old_one(tmp_path: Path) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text("labels.enable: a\nlabels.enable: b\n")
    new.write_text(COLLISION)
    code, lines = run(
        "lj-exporter", env={"LJ_EXPORTER_PROTOCOL_FILE": str(old), "LJ_PROTOCOL_FILE": str(new)}
    )
    refused(code, lines, str(new), COLLISION_LINE)
