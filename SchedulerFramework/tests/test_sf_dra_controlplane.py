"""lj-scheduler on the real control plane beside DRA: a pod whose claim no device can serve
(here: its DeviceClass is not there) stays Pending with the reason, and a DRA node with a
stale device inventory gets no device pod. Allocation itself: tests/e2e/test_dra_lj_scheduler.py."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.envtest.nodes import NodeFactory
from lj_runtimekit.proto.pkg.kube import KubeClient
from lj_runtimekit.proto.pkg.protocol import DRA_MODE, load_protocol
from lj_runtimekit.testkit.scheduler.process import (
    SchedulerProcess,
    annotate_inventory,
)
from lj_runtimekit.testkit.scheduler.process import bound_pods as bound
from lj_runtimekit.testkit.scheduler.process import pod_events as events
from lj_runtimekit.testkit.scheduler.process import pod_manifest as pod
from lj_runtimekit.testkit.waits import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.usefixtures("runtime_class")]
P = load_protocol()
GPU = P.resources.gpu


def test_claim_pod_stays_pending_and_dra_node_gets_no_device_pod(
    api_client: k8s_client.ApiClient,
    namespace: str,
    node_factory: NodeFactory,
    scheduler: SchedulerProcess,
) -> None:
    core = k8s_client.CoreV1Api(api_client)
    kube = KubeClient(api_client)
    name = f"lj-{namespace}"
    # a node switched to DRA mode that still carries its Device Plugin inventory annotation
    dra = node_factory.create(f"{namespace}-dra", labels={P.labels.device_api: DRA_MODE})
    annotate_inventory(core, dra)
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    kube.request(
        "POST",
        claims_path,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": P.dra.whole_class("gpu")},
                        }
                    ]
                }
            },
        },
    )
    claims = [{"name": "gpu", "resourceClaimName": "gpu"}]
    core.create_namespaced_pod(
        namespace, pod("claim", name, node_factory.selector, {}, resourceClaims=claims)
    )
    core.create_namespaced_pod(namespace, pod("device", name, node_factory.selector, {GPU: "1"}))

    def condition(pod_name: str) -> Any:
        p = core.read_namespaced_pod(pod_name, namespace)
        found = [c for c in p.status.conditions or () if c.type == "PodScheduled"]
        return found[0] if found else None

    for pod_name in ("claim", "device"):
        wait_for(
            lambda pod_name=pod_name: condition(pod_name) is not None,  # type: ignore[misc]
            60,
            f"PodScheduled of {pod_name} written",
            describe=scheduler.text,
        )
    c = condition("claim")
    assert (c.status, c.reason) == ("False", "Unschedulable")
    assert f"DeviceClass '{P.dra.whole_class('gpu')}' not found" in c.message, c.message
    c = condition("device")
    assert (c.status, c.reason) == ("False", "Unschedulable")
    assert "1 node(s) serve devices through DRA" in c.message, c.message
    assert bound(core, namespace) == {}
    # a Device Plugin node: the device pod lands there, the claim pod still nowhere
    plugin_node = node_factory.create(f"{namespace}-dp")
    annotate_inventory(core, plugin_node)
    wait_for(
        lambda: "device" in bound(core, namespace),
        60,
        "device pod bound",
        describe=lambda: str(events(core, namespace, "device")),
    )
    assert bound(core, namespace)["device"].spec.node_name == plugin_node
    # the claim pod still waits for its class: once the device pod is bound, nothing else is
    assert set(bound(core, namespace)) == {"device"}
    claim = kube.request("GET", f"{claims_path}/gpu")
    assert not (claim.get("status") or {}).get("allocation")
    assert condition("claim").status == "False"
