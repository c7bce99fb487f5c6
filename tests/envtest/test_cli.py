"""lj-envtest operator mistakes: clear one-line errors, no tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit.envtest.cli import main


def test_cluster_up_without_binaries_names_make_k8s_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LJ_RUNTIMEKIT_K8S_BIN", str(tmp_path / "empty"))
    assert main(["cluster-up", f"--state-dir={tmp_path / 'c'}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lj-envtest: error: Kubernetes tools missing")
    assert "make k8s-tools" in err
    assert not (tmp_path / "c").exists()


def test_cluster_down_without_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster-down", f"--state-dir={tmp_path / 'none'}"]) == 0
    assert "no cluster running" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cluster-up", "--nodes=-1"], "--nodes must be >= 0"),
        (["bench", "--nodes=0"], "--starts and --nodes must be >= 1"),
    ],
)
def test_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_bench_without_build_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LJ_RUNTIMEKIT_CACHE", str(tmp_path))
    assert main(["bench", f"--out={tmp_path / 'out.json'}"]) == 1
    assert "no cold build record" in capsys.readouterr().err
