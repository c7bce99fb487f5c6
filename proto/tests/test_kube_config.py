"""Where the API server is: kubeconfig, in-cluster, or none (pure: files and variables)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit.proto.pkg.kube import (
    KubeClient,
    KubeConfigError,
    NoApiAccessError,
    load_api_client,
    load_configuration,
)

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
