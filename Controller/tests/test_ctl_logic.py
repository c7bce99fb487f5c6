"""Pure logic of the Controller: Job manifest, state machine, Job interpretation, config
validation, the keyed work queue, and the command line's handling of operator mistakes."""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
import os
import subprocess
import sys
from typing import Any, cast

import pytest
from pytest_mock import MockerFixture

from lj_runtimekit.controller.cmd.controller import main as controller_main
from lj_runtimekit.controller.cmd.job_agent import main as agent_main
from lj_runtimekit.controller.internal.config.config import (
    ConfigError,
    ControllerSettings,
    JobSettings,
    RetryPolicy,
)
from lj_runtimekit.controller.internal.controller import node_controller
from lj_runtimekit.controller.internal.controller.job_recorder import (
    JobRecorder,
    JobView,
    not_started_cause,
    termination_message,
)
from lj_runtimekit.controller.internal.controller.node_controller import (
    NodeController,
    parse_selector,
)
from lj_runtimekit.controller.internal.health.server import HealthServer
from lj_runtimekit.controller.internal.jobspec import jobspec
from lj_runtimekit.controller.internal.kube.client import Kube
from lj_runtimekit.controller.internal.memory import arenas
from lj_runtimekit.controller.internal.nodestate.state import (
    NodeState,
    desired_action,
    label_value_is_invalid,
    retry_time,
    transition,
)
from lj_runtimekit.controller.internal.operator.operator import (
    SETTLE_DELAYS_S,
    Controller,
    Triggers,
    WatchSettings,
)
from lj_runtimekit.controller.internal.workqueue.queue import Requeue, WorkQueue

MESSAGE = "lj-runtimekit.io/feature-message"
LONG_NODE = "gpu-" + "x" * 240 + ".example"


def test_job_names_are_deterministic_short_and_per_action() -> None:
    assert jobspec.job_name("enable", "gpu-1") == jobspec.job_name("enable", "gpu-1")
    assert jobspec.job_name("enable", "gpu-1") != jobspec.job_name("disable", "gpu-1")
    assert jobspec.job_name("enable", "gpu-1") != jobspec.job_name("enable", "gpu-2")
    name = jobspec.job_name("disable", LONG_NODE)
    assert name.startswith("lj-runtimekit-disable-")
    assert len(name) <= 63
    labels = jobspec.labels("enable", LONG_NODE)
    assert jobspec.NODE_LABEL not in labels  # a 253-character name does not fit a label
    assert all(len(v) <= 63 for v in labels.values())


def test_job_manifest_is_pinned_least_privilege_and_bounded() -> None:
    settings = JobSettings(image="reg/agent:v1", namespace="kube-system", backoff_limit=3)
    taints = [
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
    ]
    job = jobspec.build(settings, "enable", "gpu-1", "uid-1", taints)
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == jobspec.job_name("enable", "gpu-1")
    assert meta["labels"][jobspec.ACTION_LABEL] == "enable"
    assert meta["labels"][jobspec.NODE_LABEL] == "gpu-1"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "gpu-1",
            "uid": "uid-1",
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    assert spec["backoffLimit"] == 3
    assert spec["activeDeadlineSeconds"] == 300
    assert "ttlSecondsAfterFinished" not in spec  # it would delete failed Jobs too
    rule = spec["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"]["values"] == [1, 2, 4, 5]
    pod = spec["template"]["spec"]
    assert "nodeName" not in pod
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-1"]
    assert pod["tolerations"] == [
        {"key": "dedicated", "effect": "NoSchedule", "operator": "Equal", "value": "gpu"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "operator": "Exists"},
    ]
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"
    assert pod["volumes"][0]["hostPath"] == {
        "path": "/run/amp/eKitC/xdm/sockets/",
        "type": "Directory",
    }
    container = pod["containers"][0]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert container["args"][0] == "enable"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    non_root = jobspec.build(
        JobSettings(image="i", run_as_user=65532, run_as_group=990), "disable", "n", "u", None
    )
    assert non_root["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"]


@pytest.mark.parametrize(
    ("value", "state", "wish"),
    [
        ("true", None, "enable"),
        ("true", "disabled", "enable"),
        ("true", "failed", "enable"),
        (None, None, None),  # never touched: left alone
        ("false", None, None),
        ("yes", None, None),
        (None, "enabled", "disable"),
        ("false", "enabling", "disable"),
        ("True", "enabled", "disable"),  # exactly "true" only
        (None, "disabled", "disable"),
    ],
)
def test_wish_from_label_and_state(value: str | None, state: str | None, wish: str | None) -> None:
    node = NodeState.from_annotations({"lj-runtimekit.io/feature-state": state} if state else {})
    assert desired_action(value, node) == wish


def test_state_round_trip_and_settled() -> None:
    patch = transition("enabling", "enable", "ns/job", "m" * 5000)
    annotations = patch["metadata"]["annotations"]
    assert patch["metadata"]["labels"] == {"lj-runtimekit.io/feature-state": "enabling"}
    assert len(annotations["lj-runtimekit.io/feature-message"]) == 1024
    state = NodeState.from_annotations(annotations)
    assert (state.state, state.action, state.job) == ("enabling", "enable", "ns/job")
    assert not state.settled_for("enable")
    assert NodeState(state="enabled").settled_for("enable")
    assert NodeState().settled_for("disable")
    assert not NodeState(state="failed", action="disable").settled_for("disable")
    assert NodeState.from_annotations({"lj-runtimekit.io/feature-state": "bogus"}).state is None
    assert label_value_is_invalid("yes")
    assert not label_value_is_invalid("false")
    assert not label_value_is_invalid(None)


def test_retry_backoff_doubles_up_to_the_delay_cap_and_stops_at_the_limit() -> None:
    policy = RetryPolicy(base_s=10, max_delay_s=60, limit=5)
    assert [policy.delay_s(n) for n in range(1, 6)] == [10, 20, 40, 60, None]
    assert RetryPolicy(limit=0).delay_s(1) is None
    with pytest.raises(ConfigError, match="--retry-base"):
        RetryPolicy(base_s=0)
    with pytest.raises(ConfigError, match="--retry-limit"):
        RetryPolicy(limit=-1)


def test_attempts_and_retry_time_round_trip_through_the_node() -> None:
    now = datetime.datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=datetime.UTC)
    due = retry_time(now, 20)
    assert due == "2026-01-01T12:00:21Z"  # rounded up: never early
    patch = transition("failed", "enable", "ns/job", "failed", 2, due)
    state = NodeState.from_annotations(patch["metadata"]["annotations"])
    assert (state.attempts, state.retry_at) == (2, due)
    assert state.attempts_for("enable") == 2
    assert state.attempts_for("disable") == 0
    assert state.retry_in_s(now) == pytest.approx(20.75)
    assert state.retry_in_s(now + datetime.timedelta(seconds=30)) == pytest.approx(-9.25)
    assert NodeState(state="failed", retry_at="garbage").retry_in_s(now) == 0
    assert NodeState(state="enabling", retry_at=due).retry_in_s(now) is None
    cleared = transition("enabling", "enable", "ns/job")["metadata"]["annotations"]
    assert cleared["lj-runtimekit.io/feature-attempts"] is None
    assert cleared["lj-runtimekit.io/feature-retry-at"] is None


def test_triggers_report_a_changed_or_reapplied_label_but_not_first_sight() -> None:
    renewed: list[str] = []
    triggers = Triggers("lj_runtimekit_enable", renewed.append)

    def body(value: str | None, uid: str = "u1") -> dict[str, Any]:
        labels = {"lj_runtimekit_enable": value} if value is not None else {}
        return {"metadata": {"uid": uid, "labels": labels}}

    assert triggers.node(None, "n", body("true"))
    assert not triggers.node("MODIFIED", "n", body("true"))
    assert renewed == []
    assert triggers.node("MODIFIED", "n", body("false"))
    assert renewed == ["n"]
    assert triggers.node("DELETED", "n", body(None))
    assert triggers.node("ADDED", "n", body("true"))
    assert renewed == ["n", "n"]
    assert triggers.node("ADDED", "m", body("true", "u2"))
    assert renewed == ["n", "n"]
    failed = {
        "annotations": {
            "lj-runtimekit.io/feature-state": "failed",
            "lj-runtimekit.io/feature-action": "enable",
        },
        "labels": {"lj_runtimekit_enable": "true"},
    }
    assert not triggers.unsettled(failed)
    failed["annotations"]["lj-runtimekit.io/feature-retry-at"] = "2026-01-01T00:00:00Z"
    assert triggers.unsettled(failed)


class FakeKube:
    """The calls the node reconciler makes, on in-memory Nodes and Jobs."""

    def __init__(self, *nodes: str) -> None:
        self.nodes: dict[str, dict[str, Any]] = {
            n: {"metadata": {"name": n, "uid": f"uid-{n}", "labels": {}, "annotations": {}}}
            for n in nodes
        }
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    async def read_node(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.nodes.get(name))

    async def patch_node(
        self, name: str, patch: dict[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        meta = self.nodes[name]["metadata"]
        for key in ("labels", "annotations"):
            for k, v in (patch["metadata"].get(key) or {}).items():
                if v is None:
                    meta[key].pop(k, None)
                else:
                    meta[key][k] = v
        return copy.deepcopy(self.nodes[name])

    async def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.jobs.values()))

    async def create_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        manifest["metadata"]["uid"] = f"uid-{len(self.jobs)}-{manifest['metadata']['name']}"
        self.jobs[manifest["metadata"]["name"]] = manifest
        return manifest

    async def delete_job(self, namespace: str, name: str, uid: str, propagation: str) -> bool:
        job = self.jobs.get(name)
        if job is None or job["metadata"]["uid"] != uid:
            return False
        job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return True

    def node_event(self, namespace: str, node: Any, kind: str, reason: str, msg: str) -> None:
        self.events.append((kind, reason, msg))

    def label(self, name: str, value: str | None) -> None:
        labels = self.nodes[name]["metadata"]["labels"]
        labels.pop("lj_runtimekit_enable", None)
        if value is not None:
            labels["lj_runtimekit_enable"] = value


async def test_no_vanished_job_warning_for_a_job_the_controller_superseded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube("gpu-1")
    nodes = _nodes(kube)
    kube.label("gpu-1", "true")
    assert await nodes.reconcile("gpu-1") == Requeue(3.0, "job started")
    (enable,) = kube.jobs
    kube.label("gpu-1", None)  # the wish flips while the enable Job runs: superseded
    assert await nodes.reconcile("gpu-1") is not None
    assert kube.jobs[enable]["metadata"]["deletionTimestamp"]
    kube.label("gpu-1", "true")  # flips back before a disable Job was created
    del kube.jobs[enable]  # the deletion has finished
    with caplog.at_level(logging.WARNING):
        assert await nodes.reconcile("gpu-1") is not None
    assert list(kube.jobs) == [enable]  # created again
    assert not [r for r in caplog.records if "vanished" in r.getMessage()]

    del kube.jobs[enable]  # deleted by hand while running: that one is worth a warning
    with caplog.at_level(logging.WARNING):
        assert await nodes.reconcile("gpu-1") is not None
    assert [r for r in caplog.records if "vanished" in r.getMessage()]


def _nodes(kube: FakeKube) -> NodeController:
    return NodeController(
        cast(Kube, kube),
        ControllerSettings(job=JobSettings(image="reg/agent:v1")),
        JobRecorder(cast(Kube, kube), "default"),
    )


async def test_a_pod_that_cannot_start_names_its_cause_on_the_node_long_before_the_deadline() -> (
    None
):
    kube = FakeKube("gpu-1")
    nodes = _nodes(kube)
    kube.label("gpu-1", "true")
    await nodes.reconcile("gpu-1")
    (job,) = kube.jobs.values()
    kube.pods = [
        {
            "metadata": {
                "name": "agent-pod",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"uid": job["metadata"]["uid"]}],
            },
            "status": {
                "containerStatuses": [
                    {
                        "name": "agent",
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "reg/agent:v1"',
                            }
                        },
                    }
                ]
            },
        }
    ]
    annotations = kube.nodes["gpu-1"]["metadata"]["annotations"]
    assert await nodes.reconcile("gpu-1") == Requeue(3.0, "job running")  # too young to look
    assert "not started" not in (annotations.get(MESSAGE) or "")
    since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=10)
    annotations["lj-runtimekit.io/feature-since"] = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    again = await nodes.reconcile("gpu-1")
    assert again is not None
    assert 10 <= again.after_s < 12
    assert annotations["lj-runtimekit.io/feature-state"] == "enabling"
    assert annotations[MESSAGE] == (
        f"enable Job {job['metadata']['namespace']}/"
        f"{job['metadata']['name']} not started: pod agent-pod: ImagePullBackOff:"
        ' Back-off pulling image "reg/agent:v1"'
    )


async def test_a_superseded_job_stuck_deleting_is_polled_with_backoff_and_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_controller, "STUCK_DELETION_S", 0.0)
    kube = FakeKube("gpu-1")
    nodes = _nodes(kube)
    kube.label("gpu-1", "true")
    await nodes.reconcile("gpu-1")
    kube.label("gpu-1", None)  # the enable Job is superseded and never goes away
    delays = []
    for _ in range(8):
        requeue = await nodes.reconcile("gpu-1")
        assert requeue is not None
        delays.append(requeue.after_s)
    assert delays == [1, 1, 2, 4, 8, 16, 30, 30]
    stuck = [e for e in kube.events if e[1] == "FeatureJobDeletionStuck"]
    assert len(stuck) == 1
    assert stuck[0][0] == "Warning"
    (job,) = kube.jobs.values()
    assert f"for Job {job['metadata']['namespace']}/{job['metadata']['name']}" in stuck[0][2]

    del kube.jobs[job["metadata"]["name"]]  # gone at last: the next wait starts afresh
    await nodes.reconcile("gpu-1")
    kube.label("gpu-1", "true")
    assert (await nodes.reconcile("gpu-1")) == Requeue(1.0, "superseded Job deleting")


def test_not_started_cause_reads_waiting_reasons_conditions_and_a_slow_mount() -> None:
    def pod(status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "p"}, "status": status}

    creating = {"state": {"waiting": {"reason": "ContainerCreating"}}}
    assert not_started_cause([pod({"containerStatuses": [creating]})], 5) is None
    slow = not_started_cause([pod({"containerStatuses": [creating]})], 25)
    assert slow is not None
    assert "ContainerCreating for 25 s" in slow
    config = {"state": {"waiting": {"reason": "CreateContainerConfigError", "message": "m"}}}
    assert not_started_cause([pod({"containerStatuses": [config]})], 1) == (
        "pod p: CreateContainerConfigError: m"
    )
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available",
    }
    assert not_started_cause([pod({"conditions": [unschedulable]})], 1) == (
        "pod p: Unschedulable: 0/3 nodes are available"
    )
    assert not_started_cause([], 100) is None


def _job(conditions: list[dict[str, str]], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "lj-runtimekit-enable-x",
            "uid": "u1",
            "labels": {jobspec.ACTION_LABEL: "enable"},
            "annotations": {jobspec.NODE_ANNOTATION: "gpu-1"},
            **meta,
        },
        "status": {"conditions": conditions},
    }


def test_job_view_phases() -> None:
    assert JobView.of(_job([])).phase == "active"
    done = JobView.of(_job([{"type": "Complete", "status": "True"}]))
    assert (done.phase, done.node, done.action, done.ref) == (
        "succeeded",
        "gpu-1",
        "enable",
        "ns/lj-runtimekit-enable-x",
    )
    failed = JobView.of(
        _job([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "m"}])
    )
    assert (failed.phase, failed.reason, failed.message) == ("failed", "DeadlineExceeded", "m")
    assert JobView.of(_job([], deletionTimestamp="2026-01-01T00:00:00Z")).phase == "deleting"


def test_termination_message_of_newest_failed_pod() -> None:
    def pod(created: str, message: str, code: int) -> dict[str, Any]:
        return {
            "metadata": {"creationTimestamp": created},
            "status": {
                "containerStatuses": [
                    {
                        "name": "agent",
                        "state": {"terminated": {"exitCode": code, "message": message}},
                    }
                ]
            },
        }

    pods = [pod("2026-01-01T00:00:01Z", "old", 3), pod("2026-01-01T00:00:09Z", "newest\n", 5)]
    assert termination_message(pods) == "newest (exit code 5)"
    assert termination_message([]) is None
    evicted = {"metadata": {}, "status": {"message": "The node was low on resource: memory."}}
    assert termination_message([evicted]) == "The node was low on resource: memory."


def test_selector_parsing() -> None:
    terms = parse_selector("a=b,!c,d,e!=f")
    assert all(t.matches({"a": "b", "d": "", "e": "g"}) for t in terms)
    assert not all(t.matches({"a": "b", "c": "1", "d": ""}) for t in terms)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"image": " "}, "--job-image"),
        ({"image": "i", "namespace": "Kube_System"}, "--namespace"),
        ({"image": "i", "socket_dir": "run/x"}, "--socket-dir"),
        ({"image": "i", "backoff_limit": 50}, "--job-backoff-limit"),
        ({"image": "i", "active_deadline_s": 5}, "--job-active-deadline"),
        ({"image": "i", "agent_retry_timeout_s": 400}, "--agent-retry-timeout"),
        ({"image": "i", "image_pull_policy": "Sometimes"}, "--job-image-pull-policy"),
    ],
)
def test_job_settings_errors_name_the_flag(kwargs: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        JobSettings(**kwargs)


def test_controller_settings_errors_name_the_flag() -> None:
    job = JobSettings(image="i")
    with pytest.raises(ConfigError, match="--label-key"):
        ControllerSettings(job=job, label_key="bad key!")
    with pytest.raises(ConfigError, match="--node-selector"):
        ControllerSettings(job=job, node_selector="a in (b)")
    assert ControllerSettings(job=job, node_selector="pool=gpu").node_watch_selector == (
        "lj_runtimekit_enable,pool=gpu"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--job-image is required"),
        (["--job-image=i", "--label-key=a b"], "--label-key"),
        (["--job-image=i", "--lease-renew-deadline=20"], "--lease-retry-period <"),
        (["--job-image=i", "--job-pod-annotations=novalue"], "--job-pod-annotations"),
        (["--job-image=i", "--kubeconfig=/nonexistent/kubeconfig"], "no Kubernetes credentials"),
    ],
)
def test_operator_mistakes_exit_1_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert controller_main.main([*argv, "--log-format=text"]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


async def test_workqueue_dedups_serializes_and_backs_off() -> None:
    seen: list[str] = []
    active: set[str] = set()
    overlap = False
    failures = {"b": 2}
    gate = asyncio.Event()

    async def reconcile(key: str) -> Requeue | None:
        nonlocal overlap
        overlap = overlap or key in active
        active.add(key)
        seen.append(key)
        await gate.wait()
        active.discard(key)
        if failures.get(key):
            failures[key] -= 1
            raise RuntimeError("transient")
        if key == "c" and seen.count("c") == 1:
            return Requeue(0.05)
        return None

    queue = WorkQueue(reconcile, workers=4, base_backoff_s=0.01)
    queue.start()
    for key in ("a", "a", "b", "c", "a"):
        queue.add(key)
    await asyncio.sleep(0.05)
    queue.add("a")  # while "a" runs: once more afterwards, never concurrently
    gate.set()
    for _ in range(200):
        if len(queue) == 0 and seen.count("b") == 3 and seen.count("c") == 2:
            break
        await asyncio.sleep(0.01)
    await queue.stop()
    assert not overlap
    assert seen.count("a") == 2
    assert seen.count("b") == 3  # two failures retried with backoff
    assert seen.count("c") == 2  # requeued once
    assert queue.errors == 2


async def test_health_endpoints() -> None:
    server = HealthServer("127.0.0.1", 0)
    await server.start()

    async def get(path: str) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        status = (await reader.readline()).decode().strip()
        writer.close()
        await writer.wait_closed()
        return status

    try:
        assert await get("/healthz") == "HTTP/1.1 200 OK"
        assert await get("/readyz") == "HTTP/1.1 503 Service Unavailable"
        server.ready = True
        assert await get("/readyz") == "HTTP/1.1 200 OK"
        assert await get("/metrics") == "HTTP/1.1 404 Not Found"
    finally:
        await server.stop()


async def test_liveness_fails_when_the_watches_stall_while_the_resync_finds_work(
    mocker: MockerFixture,
) -> None:
    kube = mocker.Mock()
    unsettled = {"gpu-1": {"labels": {"lj_runtimekit_enable": "true"}, "annotations": {}}}
    kube.node_metadata = mocker.AsyncMock(return_value=unsettled)
    controller = Controller(
        ControllerSettings(job=JobSettings(image="i")),
        kube,
        login=mocker.Mock(),
        watch=WatchSettings(stall_timeout_s=0.05),
    )
    server = HealthServer("127.0.0.1", 0)
    server.alive = controller.liveness
    await server.start()

    async def healthz() -> tuple[str, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        response = (await reader.read()).decode()
        writer.close()
        await writer.wait_closed()
        return response.splitlines()[0], response.splitlines()[-1]

    try:
        assert await controller.resync_once(everything=False) == 1
        assert (await healthz())[0] == "HTTP/1.1 200 OK"  # work found just now
        await asyncio.sleep(0.1)  # the watches bring nothing (stalled) ...
        assert await controller.resync_once(everything=False) == 1  # ... the work stays
        status, body = await healthz()
        assert status == "HTTP/1.1 503 Service Unavailable"
        assert body.startswith("watches stalled: no watch event for")
        controller.watch_event()  # an event: the watches are alive
        assert (await healthz())[0] == "HTTP/1.1 200 OK"
        await asyncio.sleep(0.1)
        kube.node_metadata.return_value = {}
        assert await controller.resync_once(everything=False) == 0  # nothing to do: quiet is fine
        assert (await healthz())[0] == "HTTP/1.1 200 OK"
        controller._kopf = asyncio.create_task(asyncio.sleep(0))
        await controller._kopf
        assert (await healthz())[1] == "the watches (kopf) stopped"
    finally:
        await server.stop()


async def test_resync_soon_after_start_then_every_period(
    mocker: MockerFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A label removed while the watches make their first list is caught within seconds,
    not after a whole --resync-period."""
    settings = ControllerSettings(job=JobSettings(image="i"), resync_period_s=120)
    controller = Controller(settings, mocker.Mock(), login=mocker.Mock())
    passes: list[bool] = []
    waits: list[float] = []

    async def resync_once(everything: bool) -> int:
        passes.append(everything)
        return 0

    class Done(Exception):
        pass

    async def sleep(delay: float) -> None:
        waits.append(delay)
        if len(waits) == 4:
            raise Done

    monkeypatch.setattr(controller, "resync_once", resync_once)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    with pytest.raises(Done):
        await controller.resync_forever()
    assert passes == [True, False, False, False]
    assert waits == [*SETTLE_DELAYS_S, 120, 120]
    assert sum(SETTLE_DELAYS_S) <= 30


@pytest.mark.parametrize(
    ("main", "argv", "env", "flag", "status"),
    [
        (
            controller_main.main,
            ["--job-image=i"],
            ("LJ_CONTROLLER_LEADER_ELECT", "maybe"),
            "--leader-elect",
            1,
        ),
        (
            controller_main.main,
            ["--job-image=i"],
            ("LJ_CONTROLLER_WORKERS", "many"),
            "--workers",
            1,
        ),
        (agent_main.main, ["enable"], ("LJ_JOB_AGENT_RETRY_ATTEMPTS", "x"), "--retry-attempts", 2),
    ],
)
def test_a_bad_environment_value_is_a_flag_mistake(
    main: Any,
    argv: list[str],
    env: tuple[str, str],
    flag: str,
    status: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(*env)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert flag in line
    assert repr(env[1]) in line


_ARENAS = """
import ctypes, os, sys, tempfile, threading
from lj_runtimekit.controller.internal.memory.arenas import cap_malloc_arenas
capped = cap_malloc_arenas()
def work():
    kept = [bytearray(20_000) for _ in range(50)]  # malloc in this thread
    started.wait()
started = threading.Barrier(13)
threads = [threading.Thread(target=work) for _ in range(12)]
for t in threads:
    t.start()
started.wait()
for t in threads:
    t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fclose(ctypes.c_void_p(fp))
print(capped, open(path).read().count("<heap nr="))
os.unlink(path)
"""


@pytest.mark.parametrize(("env", "capped"), [({}, True), ({"MALLOC_ARENA_MAX": "8"}, False)])
def test_malloc_arenas_are_capped_unless_set(env: dict[str, str], capped: bool) -> None:
    """Twelve threads allocating at once share two glibc arenas, not one each (the
    variable, when set, is left to glibc)."""
    run_env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", _ARENAS], capture_output=True, text=True, env=run_env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    was_capped, heaps = done.stdout.split()
    assert was_capped == str(capped)
    if capped:
        assert int(heaps) <= arenas.MALLOC_ARENAS
    else:
        assert int(heaps) > arenas.MALLOC_ARENAS
