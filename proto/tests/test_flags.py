"""Shared flag parsing: one-line errors naming the flag, the exit status, value types."""

from __future__ import annotations

import argparse

import pytest

from lj_runtimekit.proto.pkg.flags import FlagParser, boolean, port, positive_seconds


def _parser(error_status: int = 1) -> FlagParser:
    p = FlagParser(prog="lj-test", error_status=error_status)
    p.add_argument("--port", type=port, default="8080")
    p.add_argument("--interval", type=positive_seconds, default="15")
    p.add_argument("--enabled", type=boolean, default="true")
    return p


def test_values_and_string_defaults_are_converted() -> None:
    args = _parser().parse_args(["--port=0", "--interval=0.5", "--enabled=OFF"])
    assert (args.port, args.interval, args.enabled) == (0, 0.5, False)
    defaults = _parser().parse_args([])
    assert (defaults.port, defaults.interval, defaults.enabled) == (8080, 15.0, True)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--port=70000"], ["--port", "'70000'", "0..65535"]),
        (["--port=http"], ["--port", "not a port number"]),
        (["--interval=0"], ["--interval", "positive"]),
        (["--interval=nan"], ["--interval", "positive"]),
        (["--interval=inf"], ["--interval", "positive"]),
        (["--enabled=maybe"], ["--enabled", "not a boolean"]),
        (["--no-such-flag"], ["--no-such-flag"]),
    ],
)
def test_a_mistake_is_one_line_and_exit_1(
    argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(argv)
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("lj-test: error: ")
    assert line.endswith("(see --help)")
    for needle in needles:
        assert needle in line


def test_a_command_may_document_another_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser(error_status=2).parse_args(["--port=-1"])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_types_reject_with_argparse_errors() -> None:
    for fn, text in ((boolean, "2"), (port, "65536"), (positive_seconds, "-3")):
        with pytest.raises(argparse.ArgumentTypeError):
            fn(text)


def test_env_flags_flag_then_environment_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LJ_T_PORT", "9100")
    monkeypatch.setenv("NODE_NAME", "from-fallback")
    monkeypatch.setenv("LJ_T_EMPTY", "")
    p = FlagParser(prog="t")
    p.env_flag("--port", "LJ_T_PORT", "80", "port", type=port)
    p.env_flag("--node", ("LJ_T_NODE", "NODE_NAME"), "host", "node", shown="the host name")
    p.env_flag("--url", "LJ_T_EMPTY", "http://x", "url; empty: off")
    p.env_flag("--grace", "LJ_T_GRACE", "30", "seconds", type=float)
    p.log_flags("LJ_T_")
    args = p.parse_args([])
    assert (args.port, args.node, args.url, args.grace) == (9100, "from-fallback", "", 30.0)
    assert (args.log_level, args.log_format) == ("INFO", "auto")
    assert p.parse_args(["--port", "81"]).port == 81  # the flag wins
    monkeypatch.setenv("LJ_T_LOG_LEVEL", "debug")
    q = FlagParser(prog="t")
    q.log_flags("LJ_T_")
    assert q.parse_args([]).log_level == "DEBUG"
    text = " ".join(p.format_help().split())
    assert "(env LJ_T_NODE or NODE_NAME, default the host name)" in text
    assert "(env LJ_T_PORT, default 80)" in text


def test_a_bad_environment_value_is_reported_like_a_bad_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LJ_T_PORT", "http")
    p = FlagParser(prog="t")
    p.env_flag("--port", "LJ_T_PORT", "80", "port", type=port)
    with pytest.raises(SystemExit) as exited:
        p.parse_args([])
    assert exited.value.code == 1
    assert "--port: 'http' is not a port number" in capsys.readouterr().err
