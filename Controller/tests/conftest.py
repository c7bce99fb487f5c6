"""Controller test fixtures: the Controller subprocess against the session control plane.

The helpers live in the shared test kit (lj_runtimekit.testkit.controller), with the
Controller's benchmarks and the deploy tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.testkit.controller import OperatorProcess, StartOperator


@pytest.fixture
def start_operator(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[StartOperator]:
    """Start `lj-controller` subprocesses scoped to the test's namespace and node group;
    all are stopped afterwards and their logs printed when the test failed."""
    started: list[OperatorProcess] = []

    def start(*extra: str, kubeconfig: Path | None = None) -> OperatorProcess:
        op = OperatorProcess(
            kubeconfig or control_plane.kubeconfig_path,
            namespace,
            tmp_path / f"controller-{len(started)}.log",
            *extra,
            node_selector=f"envtest.lj-runtimekit.io/group={namespace}",
        )
        started.append(op.start())
        return op

    yield start
    for op in started:
        if op.proc is not None:
            op.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for op in started:
            print(f"--- {op.log_path} ---\n{op.log()[-20000:]}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if call.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


# The kubernetes client builds ApiException (every 404 the envtest fixtures and these
# tests expect) through urllib3's deprecated HTTPResponse.getheaders().
_K8S_CLIENT_DEPRECATION = "ignore:HTTPResponse.getheaders:DeprecationWarning"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.path)).resolve().is_relative_to(here):
            item.add_marker(pytest.mark.filterwarnings(_K8S_CLIENT_DEPRECATION))
