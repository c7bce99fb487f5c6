"""Extender exposure: loopback only, unless TLS with an authenticated caller."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.envtest.process import Process
from lj_runtimekit.proto.pkg.protocol import load_protocol
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.scheduler.process import SchedulerProcess, annotate_inventory
from lj_runtimekit.testkit.scheduler.process import bound_pods as bound
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

P = load_protocol()
SAMPLE = Path(__file__).parent.parent / "config" / "extender" / "kube-scheduler-config.yaml"
MAIN = "lj_runtimekit.schedulerframework.cmd.scheduler.main"
FILTER_BODY = json.dumps(
    {"Pod": {"metadata": {"name": "x", "uid": "u"}, "spec": {}}, "NodeNames": []}
).encode()


def start_fails(*flags: str) -> str:
    """Runs lj-scheduler in extender mode with `flags`; asserts exit 1, returns its output."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", MAIN, "--mode=extender", "--metrics-port=0"),
            *("--log-format=text", "--kubeconfig=/nonexistent/kubeconfig", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out
    return out


def test_beyond_loopback_needs_tls_and_an_authenticated_caller(tmp_path: Path) -> None:
    beyond = "is not a loopback address"
    assert beyond in start_fails("--extender-address=0.0.0.0")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    assert "must be given together" in start_fails(f"--extender-tls-cert={cert}")
    tls = (f"--extender-tls-cert={cert}", f"--extender-tls-key={key}")
    out = start_fails("--extender-address=10.1.2.3", *tls)
    assert "--extender-client-ca or --extender-token-file" in out
    token = tmp_path / "token"
    assert f"--extender-token-file {token}: cannot read" in start_fails(
        f"--extender-token-file={token}"
    )
    token.write_text("\n")
    assert "the file is empty" in start_fails(f"--extender-token-file={token}")
    ca = tmp_path / "ca.crt"
    assert "--extender-client-ca needs TLS" in start_fails(f"--extender-client-ca={ca}")


def post(
    url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        url, data=FILTER_BODY, method="POST", headers={"Content-Type": "application/json"}
    )
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def serving(control_plane: ControlPlane, name: str, *flags: str) -> tuple[SchedulerProcess, int]:
    pki = control_plane.pki
    assert pki is not None
    port = free_port()
    s = SchedulerProcess(
        control_plane.kubeconfig_path,
        name,
        "--mode=extender",
        f"--extender-port={port}",
        "--extender-address=0.0.0.0",
        f"--extender-tls-cert={pki.serving_cert}",
        f"--extender-tls-key={pki.serving_key}",
        *flags,
    ).start()
    wait_for(lambda: "extender serving" in s.text(), 60, "extender serving", describe=s.text)
    return s, port


@pytest.mark.controlplane
def test_tls_with_a_bearer_token(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    pki = control_plane.pki
    assert pki is not None
    (tmp_path / "token").write_text("s3cret-token\n")
    s, port = serving(control_plane, f"lj-{namespace}", f"--extender-token-file={tmp_path}/token")
    try:
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        url = f"https://127.0.0.1:{port}/filter"
        code, body = post(url, context)
        assert code == 401
        assert body["Error"] == "missing or wrong bearer token"
        code, _ = post(url, context, {"Authorization": "Bearer wrong"})
        assert code == 401
        code, body = post(url, context, {"Authorization": "Bearer s3cret-token"})
        assert code == 200
        assert body["NodeNames"] == []
    finally:
        s.stop()


@pytest.fixture
def tls_extender(
    control_plane: ControlPlane, namespace: str
) -> Iterator[tuple[SchedulerProcess, int]]:
    pki = control_plane.pki
    assert pki is not None
    s, port = serving(control_plane, f"lj-{namespace}", f"--extender-client-ca={pki.ca_cert}")
    yield s, port
    s.stop()


@pytest.mark.controlplane
@pytest.mark.usefixtures("runtime_class")
def test_tls_with_client_certificates_behind_the_kube_scheduler(
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    tls_extender: tuple[SchedulerProcess, int],
) -> None:
    pki = control_plane.pki
    assert pki is not None
    _, port = tls_extender
    url = f"https://127.0.0.1:{port}/filter"
    anonymous = ssl.create_default_context(cafile=str(pki.ca_cert))
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        post(url, anonymous)
    client = ssl.create_default_context(cafile=str(pki.ca_cert))
    client.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    assert post(url, client)[0] == 200

    # the kube-scheduler, as the sample's tlsConfig has it, binds through the extender
    doc = yaml.safe_load(SAMPLE.read_text())
    name = f"ext-{namespace}"
    doc["clientConnection"]["kubeconfig"] = str(control_plane.kubeconfig_path)
    doc["profiles"][0]["schedulerName"] = name
    doc["leaderElection"] = {"leaderElect": False}
    ext = doc["extenders"][0]
    ext["urlPrefix"] = f"https://127.0.0.1:{port}"
    ext["enableHTTPS"] = True
    ext["tlsConfig"] = {
        "certFile": str(pki.admin_cert),
        "keyFile": str(pki.admin_key),
        "caFile": str(pki.ca_cert),
    }
    work = Path(tempfile.mkdtemp(prefix="ljext"))
    (work / "config.yaml").write_text(yaml.safe_dump(doc))
    proc = Process(
        "kube-scheduler",
        control_plane.kube_scheduler_argv(work / "config.yaml"),
        work / "kube-scheduler.log",
    )
    proc.start()
    try:
        core = k8s_client.CoreV1Api(api_client)
        node = node_factory.create(f"{namespace}-n0")
        annotate_inventory(core, node)
        core.create_namespaced_pod(
            namespace, pod("w0", name, node_factory.selector, {P.resources.gpu: "2"})
        )
        wait_for(
            lambda: "w0" in bound(core, namespace),
            90,
            "kube-scheduler binds through the TLS extender",
            describe=lambda: (work / "kube-scheduler.log").read_text()[-3000:],
        )
        annotations = bound(core, namespace)["w0"].metadata.annotations
        assert P.annotations.assigned_devices in annotations
    finally:
        proc.stop()
