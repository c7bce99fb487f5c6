"""Where the API server is: kubeconfig, in-cluster, or none (pure: files and variables)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lj_runtimekit.proto.pkg.kube import (
    KubeClient,
    KubeConfigError,
    NoApiAccessError,
    load_access,
    load_api_client,
    load_configuration,
)
from lj_runtimekit.proto.pkg.kube import config as kube_config

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: secret-token}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


@pytest.fixture
def outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)


@pytest.mark.usefixtures("outside_a_cluster")
def test_neither_kubeconfig_nor_cluster_is_no_api_access() -> None:
    with pytest.raises(NoApiAccessError, match="no --kubeconfig given and not running in a"):
        load_configuration(None)
    with pytest.raises(NoApiAccessError):
        KubeClient.connect("")


@pytest.mark.usefixtures("outside_a_cluster")
def test_a_missing_or_broken_kubeconfig_is_configured_but_unusable(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(KubeConfigError, match=f"kubeconfig {missing} does not exist") as caught:
        load_configuration(str(missing))
    assert not isinstance(caught.value, NoApiAccessError)
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    with pytest.raises(KubeConfigError, match=f"kubeconfig {broken} is not usable: ") as caught:
        load_configuration(str(broken))
    assert not isinstance(caught.value, NoApiAccessError)


def test_in_cluster_without_the_service_account_is_unusable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="in-cluster configuration is not usable: ") as caught:
        load_configuration(None)
    assert not isinstance(caught.value, NoApiAccessError)


def test_a_kubeconfig_gives_the_server_credentials_and_pool(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    api = load_api_client(str(path), pool_size=12)
    try:
        assert api.configuration.host == "https://127.0.0.1:6443"
        assert api.configuration.connection_pool_maxsize == 12
        assert api.configuration.api_key["authorization"] == "Bearer secret-token"
    finally:
        api.close()
    default = KubeClient.connect(str(path))
    try:
        assert default.host == "https://127.0.0.1:6443"
    finally:
        default.close()


def test_access_from_a_kubeconfig_without_the_official_client(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    code = (
        "import sys\n"
        "from lj_runtimekit.proto.pkg.kube import load_access\n"
        f"access = load_access({str(path)!r})\n"
        "assert access.server == 'https://127.0.0.1:6443', access.server\n"
        "assert access.insecure\n"
        "assert access.authorization() == 'Bearer secret-token'\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.usefixtures("outside_a_cluster")
def test_access_from_a_broken_kubeconfig_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(NoApiAccessError):
        load_access(None)
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    with pytest.raises(KubeConfigError, match=f"kubeconfig {broken} is not usable: no current-"):
        load_access(str(broken))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(KUBECONFIG.replace("cluster: c,", "cluster: other,"))
    with pytest.raises(KubeConfigError, match="cluster 'other' is not in clusters"):
        load_access(str(unknown))
    odd = tmp_path / "odd.yaml"
    odd.write_text("current-context: x\ncontexts: [just-a-string]\n")
    with pytest.raises(KubeConfigError, match=f"kubeconfig {odd} is not usable: "):
        load_access(str(odd))


def test_in_cluster_access_rereads_the_rotated_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(kube_config, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    with pytest.raises(KubeConfigError, match="in-cluster configuration is not usable: "):
        load_access(None)
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "token").write_text("first\n")
    access = load_access(None)
    assert access.server == "https://[fd00::1]:443"
    assert access.authorization() == "Bearer first"
    (tmp_path / "token").write_text("second\n")  # the kubelet rotated it
    assert access.authorization() == "Bearer first"  # read again only after a while
    monkeypatch.setattr(kube_config, "TOKEN_REREAD_S", 0.0)
    assert access.authorization() == "Bearer second"


@pytest.mark.usefixtures("outside_a_cluster")
def test_an_exec_plugin_user_is_handed_to_the_official_loader(tmp_path: Path) -> None:
    credential = (
        '{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",'
        ' "status": {"token": "from-exec"}}'
    )
    config = yaml.safe_load(KUBECONFIG)
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "echo",
            "args": [credential],
        }
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    access = load_access(str(path))
    assert access.server == "https://127.0.0.1:6443"
    assert access.authorization() == "Bearer from-exec"
