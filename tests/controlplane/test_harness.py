"""The harness itself: port clashes, failed starts keep logs, teardown kills groups,
nothing outlives a killed test runner."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lj_runtimekit.envtest import ControlPlane, ControlPlaneConfig, ControlPlaneError
from lj_runtimekit.envtest import controlplane as controlplane_mod
from lj_runtimekit.testkit.waits import wait_for

pytestmark = pytest.mark.controlplane


def minimal(
    state_dir: Path | None = None, apiserver_args: list[str] | None = None
) -> ControlPlaneConfig:
    """etcd and kube-apiserver only."""
    return ControlPlaneConfig(
        controller_manager=False,
        scheduler=False,
        kwok=False,
        state_dir=state_dir,
        extra_apiserver_args=apiserver_args or [],
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_taken_between_pick_and_bind_is_retried(
    k8s_tools: dict[str, Path], busy_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = controlplane_mod.free_port
    handed: list[int] = []

    def first_busy() -> int:
        port = busy_port if not handed else real()
        handed.append(port)
        return port

    monkeypatch.setattr(controlplane_mod, "free_port", first_busy)
    with ControlPlane(minimal()) as cp:
        assert cp.etcd_port != busy_port
    assert handed[0] == busy_port


def test_failed_start_keeps_logs_and_names_the_component(
    k8s_tools: dict[str, Path], tmp_path: Path
) -> None:
    cp = ControlPlane(minimal(tmp_path / "cp", ["--no-such-flag"]))
    with pytest.raises(ControlPlaneError) as info:
        cp.start()
    message = str(info.value)
    assert "kube-apiserver exited" in message
    assert "unknown flag: --no-such-flag" in message
    assert f"logs kept in {tmp_path / 'cp' / 'logs'}" in message
    assert (tmp_path / "cp" / "logs" / "kube-apiserver.log").exists()
    assert not cp.processes


def test_stop_kills_every_process_group_and_removes_temporary_state(
    k8s_tools: dict[str, Path],
) -> None:
    cp = ControlPlane(minimal()).start()
    pids = [p.pid for p in cp.processes if p.pid is not None]
    state = cp.state_dir
    assert len(pids) == 2
    cp.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert not state.exists()


CHILD = """
import time
from lj_runtimekit.envtest import ControlPlane, ControlPlaneConfig
from lj_runtimekit.testkit.waits import wait_for
from lj_runtimekit.testkit.ports import free_port
config = ControlPlaneConfig(controller_manager=False, scheduler=False, kwok=False)
cp = ControlPlane(config).start()
print(" ".join(str(p.pid) for p in cp.processes), flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux only")
def test_components_die_with_a_killed_runner(k8s_tools: dict[str, Path]) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True
    ) as runner:
        try:
            assert runner.stdout is not None
            pids = [int(p) for p in runner.stdout.readline().split()]
            assert len(pids) == 2
        finally:
            runner.kill()  # no teardown runs
    wait_for(lambda: not any(_alive(p) for p in pids), 15, "components of a killed runner to die")


def _who(cp: ControlPlane, cert: Path, key: Path, user_header: str) -> str:
    """The user name the API server makes of a request with this client certificate that
    also names `user_header` in X-Remote-User (a SelfSubjectReview)."""
    assert cp.pki is not None
    context = ssl.create_default_context(cafile=str(cp.pki.ca_cert))
    context.load_cert_chain(str(cert), str(key))
    request = urllib.request.Request(
        f"{cp.server}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        data=json.dumps(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        ).encode(),
        headers={
            "Content-Type": "application/json",
            "X-Remote-User": user_header,
            "X-Remote-Group": "system:masters",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        review = json.load(answer)
    return str(review["status"]["userInfo"]["username"])


def test_only_the_front_proxy_ca_vouches_for_request_headers(
    k8s_tools: dict[str, Path],
) -> None:
    """The front proxy's client certificate has a CA of its own (as kubeadm sets it up):
    its request headers name the user, and a client certificate of the client CA, which
    the request-header check no longer verifies, is its own user whatever it sends."""
    with ControlPlane(minimal()) as cp:
        pki = cp.pki
        assert pki is not None
        assert pki.front_proxy_ca_cert != pki.ca_cert
        assert _who(cp, pki.front_proxy_cert, pki.front_proxy_key, "alice") == "alice"
        assert _who(cp, pki.admin_cert, pki.admin_key, "mallory") == "lj-runtimekit-admin"
        for cert, issuer, signed in (
            (pki.front_proxy_cert, pki.ca_cert, False),
            (pki.front_proxy_cert, pki.front_proxy_ca_cert, True),
            (pki.admin_cert, pki.front_proxy_ca_cert, False),
        ):
            verified = subprocess.run(
                ["openssl", "verify", "-CAfile", str(issuer), str(cert)],
                capture_output=True,
                check=False,
            )
            assert (verified.returncode == 0) == signed, (cert.name, issuer.name)
