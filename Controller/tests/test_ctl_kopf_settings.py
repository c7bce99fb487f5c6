"""The kopf settings and credentials the Controller runs with: built without a cluster, so
the dependency floor check (make check-floors) catches a kopf too old for them."""

from __future__ import annotations

from lj_runtimekit.controller.internal.config.config import ControllerSettings, JobSettings
from lj_runtimekit.controller.internal.jobspec import jobspec
from lj_runtimekit.controller.internal.operator.operator import (
    WatchSettings,
    connection_info,
    kopf_settings,
)
from lj_runtimekit.proto.pkg.kube import ApiAccess


def test_watches_are_narrowed_on_the_server_and_nothing_is_written_by_kopf() -> None:
    settings = ControllerSettings(job=JobSettings(image="i"), node_selector="pool=gpu")
    s = kopf_settings(settings, WatchSettings(server_timeout_s=60.5))
    assert s.watching.label_selectors["", "v1", "nodes"] == settings.node_watch_selector
    assert s.watching.label_selectors["batch", "v1", "jobs"] == jobspec.JOB_SELECTOR
    assert s.watching.server_timeout == 60
    assert s.watching.chunk_size == 100
    assert s.queueing.idle_timeout == 1.0
    assert not s.posting.enabled
    assert s.scanning.disabled


def test_kopf_logs_in_with_the_controllers_own_credentials() -> None:
    token = connection_info(ApiAccess(server="https://api:6443", ca_data=b"CA", token="t"))
    assert (token.server, token.ca_data, token.insecure) == ("https://api:6443", b"CA", False)
    assert (token.scheme, token.token) == ("Bearer", "t")
    certs = connection_info(
        ApiAccess(server="https://api", insecure=True, cert_path="/c.pem", key_data=b"KEY")
    )
    assert (certs.scheme, certs.token, certs.insecure) == (None, None, True)
    assert (certs.certificate_path, certs.private_key_data) == ("/c.pem", b"KEY")
