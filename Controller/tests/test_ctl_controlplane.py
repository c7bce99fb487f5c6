"""The Controller on the real control plane: KWOK nodes, the real Job controller and
scheduler, the Controller as a subprocess. KWOK completes Job pods on its nodes; a
ResourceQuota of zero pods holds a Job "mid-way" (created, no pod) until the test drops it."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.kwok import failure_annotations
from lj_runtimekit.envtest.nodes import NodeFactory, Taint
from lj_runtimekit.testkit.controller import (
    ATTEMPTS,
    GROUP_LABEL,
    JOB_ANNOTATION,
    MESSAGE,
    RETRY_AT,
    Cluster,
    JobWatch,
    OperatorProcess,
    StartOperator,
    TcpProxy,
    kubeconfig_via,
)
from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.waits import wait_for

pytestmark = pytest.mark.controlplane
LABEL = "lj_runtimekit_enable"
T = 60  # seconds any single step may take on a loaded 2-core machine
JOBS_NAMESPACE = "lj-runtimekit-jobs"
"""Where config/ puts the Jobs, their Role and the Job Agent's ServiceAccount."""


@pytest.fixture
def cluster(api_client: k8s.ApiClient, namespace: str) -> Cluster:
    return Cluster(api_client, namespace)


def hold_pods(cluster: Cluster) -> None:
    """A ResourceQuota of zero pods: Jobs get created but cannot start a pod (mid-way)."""
    cluster.core.create_namespaced_resource_quota(
        cluster.namespace, {"metadata": {"name": "hold"}, "spec": {"hard": {"pods": "0"}}}
    )


def release_pods(cluster: Cluster) -> None:
    """Drop the quota and touch the Jobs so that the Job controller retries at once."""
    cluster.core.delete_namespaced_resource_quota("hold", cluster.namespace)
    wait_for(
        lambda: not cluster.core.list_namespaced_resource_quota(cluster.namespace).items,
        T,
        "quota gone",
    )
    for job in cluster.jobs():
        cluster.batch.patch_namespaced_job(
            job.metadata.name,
            cluster.namespace,
            {"metadata": {"annotations": {"test.lj-runtimekit.io/touched": str(time.time())}}},
        )


def wait_state(cluster: Cluster, node: str, state: str, timeout_s: float = T) -> None:
    wait_for(
        lambda: cluster.state(node) == state,
        timeout_s,
        f"node {node} state {state}",
        describe=lambda: f"{cluster.annotations(node)} {cluster.describe()}",
    )


def wait_no_jobs(cluster: Cluster, timeout_s: float = T) -> None:
    wait_for(
        lambda: not cluster.jobs() and not cluster.pods(),
        timeout_s,
        "Jobs and their pods cleaned up",
        describe=cluster.describe,
    )


def node_jobs(cluster: Cluster, node: str) -> list[Any]:
    return [
        j
        for j in cluster.jobs()
        if (j.metadata.annotations or {}).get("lj-runtimekit.io/node") == node
    ]


def test_label_enables_unlabel_disables_and_cleans_up(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    node = node_factory.create(
        f"{namespace}-a", enable=False, taints=[Taint("dedicated", "NoSchedule", "gpu")]
    )
    port = free_port()
    op = start_operator("--leader-elect=false", f"--health-port={port}")
    with JobWatch(cluster.batch.api_client, namespace) as jobs:
        labelled = time.monotonic()  # before the patch: the Controller cannot see it sooner
        cluster.label(node, LABEL, "true")
        wait_state(cluster, node, "enabled")
        enabled_s = time.monotonic() - labelled
        wait_no_jobs(cluster)
        annotations = cluster.annotations(node)
        assert annotations[JOB_ANNOTATION].startswith(f"{namespace}/lj-runtimekit-enable-")
        assert "succeeded" in annotations[MESSAGE]
        assert cluster.node(node).metadata.labels["lj-runtimekit.io/feature-state"] == "enabled"

        cluster.label(node, LABEL, None)
        wait_state(cluster, node, "disabled")
        wait_no_jobs(cluster)
        assert cluster.annotations(node)[JOB_ANNOTATION].startswith(
            f"{namespace}/lj-runtimekit-disable-"
        )
    assert jobs.total_created() == 2
    assert jobs.max_concurrent == 1
    assert sorted(cluster.reasons(node)) == [  # second-precision timestamps: no order
        "FeaturesDisabled",
        "FeaturesDisabling",
        "FeaturesEnabled",
        "FeaturesEnabling",
    ]
    meta = cluster.node(node).metadata
    assert not meta.finalizers
    assert not [k for k in meta.annotations if "kopf" in k or "last-handled" in k]
    assert op.alive()

    # Label change -> done, once per action, within the time the test saw it take.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    seconds = {
        (s.name, s.labels.get("action"), s.labels.get("outcome")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("lj_runtimekit_controller_label_to_done_seconds_")
    }
    name = "lj_runtimekit_controller_label_to_done_seconds"
    assert seconds[(f"{name}_count", "enable", "succeeded")] == 1
    assert seconds[(f"{name}_count", "disable", "succeeded")] == 1
    assert 0 < seconds[(f"{name}_sum", "enable", "succeeded")] <= enabled_s
    assert (f"{name}_count", "enable", "failed") not in seconds


def test_nodes_labelled_before_start_and_bad_label_value(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    ready = [node_factory.create(f"{namespace}-{i}", wait=False) for i in range(3)]
    odd = node_factory.create(f"{namespace}-odd", wait=False, labels={LABEL: "yes"})
    off = node_factory.create(f"{namespace}-off", wait=False, labels={LABEL: "false"})
    # Outside --node-selector (another group): never touched.
    outside = node_factory.create(
        f"{namespace}-outside", wait=False, labels={GROUP_LABEL: "someone-else"}
    )
    node_factory.wait_ready([*ready, odd, off, outside])
    start_operator("--leader-elect=false")
    for node in ready:
        wait_state(cluster, node, "enabled")
    wait_no_jobs(cluster)
    wait_for(
        lambda: "InvalidLabelValue" in cluster.reasons(odd), T, "Warning about the label value"
    )
    warning = next(e for e in cluster.events(odd) if e.reason == "InvalidLabelValue")
    assert warning.type == "Warning"
    assert "'yes'" in warning.message
    assert cluster.state(odd) is None
    assert cluster.state(off) is None
    assert cluster.reasons(off) == []
    assert cluster.state(outside) is None

    # A node that was enabled and gets a bad value is switched off (with the warning).
    cluster.label(ready[0], LABEL, "TRUE")
    wait_state(cluster, ready[0], "disabled")
    assert "InvalidLabelValue" in cluster.reasons(ready[0])


def test_failed_job_is_kept_with_warning_event_carrying_the_agent_message(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    message = "enable failed: Runtime EnableFeatures failed: FAILED_PRECONDITION: node draining"
    annotations = failure_annotations(5, message)
    flag = ",".join(f"{k}={v}" for k, v in annotations.items())
    node = node_factory.create(f"{namespace}-f", enable=False)
    start_operator("--leader-elect=false", f"--job-pod-annotations={flag}")
    cluster.label(node, LABEL, "true")
    wait_state(cluster, node, "failed")
    job = node_jobs(cluster, node)
    assert len(job) == 1
    conditions = {c.type: c for c in job[0].status.conditions or []}
    assert conditions["Failed"].status == "True"
    assert conditions["Failed"].reason == "PodFailurePolicy"  # exit 5: no pointless retries
    wait_for(
        lambda: "FeatureJobFailed" in cluster.reasons(node), T, "the Warning event on the node"
    )
    warning = next(e for e in cluster.events(node) if e.reason == "FeatureJobFailed")
    assert warning.type == "Warning"
    assert message in warning.message
    assert "(exit code 5)" in warning.message
    assert message in cluster.annotations(node)[MESSAGE]
    time.sleep(2)  # nothing else happens: kept, one event
    assert len(node_jobs(cluster, node)) == 1
    assert cluster.reasons(node).count("FeatureJobFailed") == 1

    # Deleting the failed Job by hand retries the wish (and it fails again here).
    uid = job[0].metadata.uid
    cluster.batch.delete_namespaced_job(
        job[0].metadata.name, namespace, propagation_policy="Background"
    )
    wait_for(
        lambda: [j for j in node_jobs(cluster, node) if j.metadata.uid != uid],
        T,
        "a new Job after the failed one was deleted",
        describe=cluster.describe,
    )
    wait_for(lambda: cluster.reasons(node).count("FeatureJobFailed") == 2, T, "second failure")


def test_retryable_failure_is_retried_with_backoff_across_a_restart_up_to_the_cap(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    message = "enable failed: Runtime unreachable at /run/lj-runtime/runtime.sock"
    annotations = failure_annotations(3, message)  # exit 3: Runtime unreachable, retryable
    flags = (
        "--leader-elect=false",
        "--job-pod-annotations=" + ",".join(f"{k}={v}" for k, v in annotations.items()),
        "--job-backoff-limit=0",
        "--retry-base=3",
        "--retry-limit=3",
    )
    node = node_factory.create(f"{namespace}-retry", enable=False)
    op = start_operator(*flags)
    with JobWatch(cluster.batch.api_client, namespace) as jobs:
        cluster.label(node, LABEL, "true")
        wait_for(
            lambda: cluster.annotations(node).get(ATTEMPTS) == "1",
            T,
            "first failure recorded with its attempt",
            describe=lambda: f"{cluster.annotations(node)} {cluster.describe()}",
        )
        assert cluster.state(node) == "failed"
        assert "attempt 1 of 3: retrying in 3 s" in cluster.annotations(node)[MESSAGE]
        assert cluster.annotations(node)[RETRY_AT]
        op.stop(signal.SIGKILL)  # the backoff lives on the Node, not in the process

        start_operator(*flags)
        wait_for(
            lambda: (
                "attempt 3 of 3: no more automatic retries"
                in cluster.annotations(node).get(MESSAGE, "")
            ),
            2 * T,
            "the third failure stops the retries",
            describe=lambda: f"{cluster.annotations(node)} {cluster.describe()}",
        )
        annotations_now = cluster.annotations(node)
        assert cluster.state(node) == "failed"
        assert RETRY_AT not in annotations_now
        assert message in annotations_now[MESSAGE]
        time.sleep(8)  # past any further backoff: nothing more happens
        assert jobs.total_created() == 3
        assert jobs.max_concurrent == 1
    assert cluster.reasons(node).count("FeatureJobFailed") == 3
    assert len(node_jobs(cluster, node)) == 1  # the last failed Job is kept


def test_permanent_failure_is_not_retried_until_the_label_is_reapplied(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    annotations = failure_annotations(4, "enable refused: Runtime 1.12.0 is too old")
    start_operator(
        "--leader-elect=false",
        "--job-pod-annotations=" + ",".join(f"{k}={v}" for k, v in annotations.items()),
        "--retry-base=1",
    )
    node = node_factory.create(f"{namespace}-perm", enable=False)
    cluster.label(node, LABEL, "true")
    wait_state(cluster, node, "failed")
    first = node_jobs(cluster, node)
    assert "not retried (permanent)" in cluster.annotations(node)[MESSAGE]
    assert RETRY_AT not in cluster.annotations(node)
    time.sleep(4)
    assert [j.metadata.uid for j in node_jobs(cluster, node)] == [first[0].metadata.uid]

    cluster.label(node, LABEL, "false")
    cluster.label(node, LABEL, "true")
    wait_for(
        lambda: any(
            j.metadata.labels.get("lj-runtimekit.io/action") == "enable"
            and j.metadata.uid != first[0].metadata.uid
            for j in node_jobs(cluster, node)
        ),
        T,
        "a new enable Job after the label was re-applied",
        describe=cluster.describe,
    )


def test_restart_mid_way_resumes_without_duplicates(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    node = node_factory.create(f"{namespace}-r", enable=False)
    hold_pods(cluster)
    op = start_operator("--leader-elect=false")
    with JobWatch(cluster.batch.api_client, namespace) as jobs:
        cluster.label(node, LABEL, "true")
        wait_state(cluster, node, "enabling")
        first = node_jobs(cluster, node)
        assert len(first) == 1
        op.stop(signal.SIGKILL)

        op2 = start_operator("--leader-elect=false")
        wait_for(lambda: "controller running" in op2.log(), T, "second Controller running")
        time.sleep(3)  # it has seen the node and its Job by now
        assert [j.metadata.uid for j in node_jobs(cluster, node)] == [first[0].metadata.uid]
        assert cluster.state(node) == "enabling"

        release_pods(cluster)
        wait_state(cluster, node, "enabled", 2 * T)
        wait_no_jobs(cluster)
    assert jobs.total_created() == 1
    assert cluster.reasons(node).count("FeaturesEnabled") == 1


def test_label_flapping_latest_wish_wins_one_job_at_a_time(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    node = node_factory.create(f"{namespace}-flap", enable=False)
    hold_pods(cluster)
    start_operator("--leader-elect=false")
    with JobWatch(cluster.batch.api_client, namespace) as jobs:
        cluster.label(node, LABEL, "true")
        wait_for(lambda: node_jobs(cluster, node), T, "enable Job created")
        for value in (None, "true", None, "true", None, "true"):
            cluster.label(node, LABEL, value)
            time.sleep(0.3)
        release_pods(cluster)
        wait_state(cluster, node, "enabled", 2 * T)
        wait_no_jobs(cluster)
        time.sleep(2)
        assert cluster.state(node) == "enabled"
    assert jobs.max_concurrent == 1, jobs.live
    assert not node_jobs(cluster, node)


def test_job_deleted_by_hand_is_recreated_and_node_deleted_mid_job_leaves_no_orphan(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    node = node_factory.create(f"{namespace}-gone", enable=False)
    hold_pods(cluster)
    op = start_operator("--leader-elect=false")
    cluster.label(node, LABEL, "true")
    wait_state(cluster, node, "enabling")
    job = node_jobs(cluster, node)[0]
    assert job.metadata.owner_references[0].kind == "Node"
    assert job.metadata.owner_references[0].block_owner_deletion is False

    # A running Job deleted by hand: the wish still stands, so it is created again.
    cluster.batch.delete_namespaced_job(
        job.metadata.name, namespace, propagation_policy="Background"
    )
    again = wait_for(
        lambda: [j for j in node_jobs(cluster, node) if j.metadata.uid != job.metadata.uid],
        T,
        "the Job created again",
        describe=cluster.describe,
    )
    assert len(node_jobs(cluster, node)) == 1

    # The node goes while its Job runs: the Job and its pod go with it (owner reference).
    cluster.core.delete_node(node)
    node_factory.created.remove(node)
    wait_for(
        lambda: not node_jobs(cluster, node) and not cluster.pods(),
        2 * T,
        "the Job and its pod garbage-collected with the node",
        describe=cluster.describe,
    )
    time.sleep(2)
    assert not node_jobs(cluster, node)
    assert again[0].metadata.name == job.metadata.name  # same deterministic name
    assert op.alive()


def test_watch_cut_and_silently_dead_stream_are_recovered(
    start_operator: StartOperator,
    node_factory: NodeFactory,
    cluster: Cluster,
    namespace: str,
    control_plane: ControlPlane,
    tmp_path: Any,
) -> None:
    nodes = [node_factory.create(f"{namespace}-w{i}", enable=False, wait=False) for i in range(3)]
    node_factory.wait_ready(nodes)
    proxy = TcpProxy(control_plane.apiserver_port).start()
    try:
        kubeconfig = kubeconfig_via(
            control_plane.kubeconfig_path, tmp_path / "via-proxy", proxy.port
        )
        op = start_operator(
            "--leader-elect=false",
            "--watch-inactivity-timeout=4",
            "--api-timeout=5",
            kubeconfig=kubeconfig,
        )
        wait_for(lambda: "controller running" in op.log(), T, "Controller running")
        cluster.label(nodes[0], LABEL, "true")
        wait_state(cluster, nodes[0], "enabled")

        # 1. The connection drops (proxy killed) and comes back later.
        proxy.kill()
        cluster.label(nodes[1], LABEL, "true")
        time.sleep(3)
        proxy.start()
        wait_state(cluster, nodes[1], "enabled")

        # 2. The open streams go silent without being closed: only the inactivity
        #    timeout can notice; new connections work.
        time.sleep(1)
        assert proxy.freeze() > 0
        connections = proxy.accepted
        cluster.label(nodes[2], LABEL, "true")
        wait_state(cluster, nodes[2], "enabled", 2 * T)
        assert proxy.accepted > connections  # the dead streams were replaced
        wait_no_jobs(cluster)
        assert op.alive()
    finally:
        proxy.kill()


def test_leader_election_one_active_replica_and_failover(
    start_operator: StartOperator, node_factory: NodeFactory, cluster: Cluster, namespace: str
) -> None:
    a = start_operator("--leader-elect=true")
    wait_for(lambda: "became leader" in a.log(), T, "first replica leads", describe=a.log)
    b = start_operator("--leader-elect=true")
    wait_for(lambda: "waiting for leadership" in b.log(), T, "second replica waits", describe=b.log)
    node = node_factory.create(f"{namespace}-le", enable=False)
    cluster.label(node, LABEL, "true")
    wait_state(cluster, node, "enabled")
    assert "became leader" not in b.log()
    a.stop(signal.SIGTERM)  # releases the Lease
    wait_for(lambda: "became leader" in b.log(), T, "second replica takes over", describe=b.log)
    cluster.label(node, LABEL, None)
    wait_state(cluster, node, "disabled")


def test_least_privilege_rbac_is_enough(
    control_plane: ControlPlane,
    node_factory: NodeFactory,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Any,
) -> None:
    """config/rbac applied for real; the Controller runs with its ServiceAccount's token
    (in kube-system; leader election on, Jobs in their own namespace with the agent's
    ServiceAccount, as config/manager runs it)."""
    rbac = Path(__file__).resolve().parents[1] / "config" / "rbac"
    applied = subprocess.run(
        control_plane.kubectl_argv("apply", "-k", str(rbac)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    core = k8s.CoreV1Api(api_client)
    token = core.create_namespaced_service_account_token(
        "lj-runtimekit-controller", "kube-system", {"spec": {"expirationSeconds": 3600}}
    ).status.token
    doc = yaml.safe_load(control_plane.kubeconfig_path.read_text())
    doc["users"] = [{"name": "controller", "user": {"token": token}}]
    doc["contexts"][0]["context"]["user"] = "controller"
    kubeconfig = tmp_path / "controller-sa"
    kubeconfig.write_text(yaml.safe_dump(doc))
    system = Cluster(api_client, JOBS_NAMESPACE)
    node = node_factory.create(f"{namespace}-rbac", enable=False)
    op = OperatorProcess(
        kubeconfig,
        JOBS_NAMESPACE,
        tmp_path / "controller-rbac.log",
        "--leader-elect=true",
        "--lease-name=lj-runtimekit-controller",
        node_selector=f"{GROUP_LABEL}={namespace}",
    )
    op.argv.remove("--job-service-account=default")
    op.start()
    try:
        system.label(node, LABEL, "true")
        wait_state(system, node, "enabled", 2 * T)
        # Posted in the background, after the state: it may lag the state by a moment.
        wait_for(lambda: "FeaturesEnabled" in system.reasons(node), T, "the Normal event")
        system.label(node, LABEL, None)
        wait_state(system, node, "disabled", 2 * T)
        assert "Forbidden" not in op.log()
        assert "forbidden" not in op.log()
    except BaseException:
        print(op.log()[-10000:])
        raise
    finally:
        op.stop()
        for job in node_jobs(system, node):
            system.batch.delete_namespaced_job(
                job.metadata.name, JOBS_NAMESPACE, propagation_policy="Background"
            )
