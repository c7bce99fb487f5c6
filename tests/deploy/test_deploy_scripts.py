"""deploy-all.sh operator mistakes and precheck, shellcheck, the Dockerfile rules, make targets
and hack/node-precheck.sh against a Runtime simulator (the Pod Security precheck runs against
the control plane, the rest needs none)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from lj_runtimekit.deploy.components import COMPONENTS
from lj_runtimekit.deploy.manifests import OLDEST_MINOR
from lj_runtimekit.envtest.controlplane import ControlPlane
from lj_runtimekit.envtest.versions import find_tools, load_versions
from lj_runtimekit.runtimesim.process import SimulatorProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deploy_lifecycle import POLICIES_SERVED

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "deploy-all.sh"


def _scripts() -> list[Path]:
    """Every shell script of the repository (tracked ones, and this issue's)."""
    mine = {SCRIPT, ROOT / "deploy/docker/build.sh", ROOT / "hack/node-precheck.sh"}
    listed = subprocess.run(
        ["git", "ls-files", "*.sh"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    tracked = {ROOT / line for line in listed.stdout.split()} if listed.returncode == 0 else set()
    return sorted(mine | {p for p in tracked if p.exists()})


SCRIPTS = _scripts()
DOCKER_DIR = ROOT / "deploy" / "docker"


def run_script(
    *args: str, env: dict[str, str] | None = None, script: Path = SCRIPT, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def log_env(tmp_path: Path) -> dict[str, str]:
    return {"LJ_DEPLOY_LOG_DIR": str(tmp_path / "logs"), "KUBECONFIG": ""}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["frobnicate"], "unknown command 'frobnicate'"),
        ([], "no command given"),
        (["deploy", "--colour=red"], "unknown option '--colour=red'"),
        (["deploy", "--components=device-plugin,gpu-operator"], "unknown component 'gpu-operator'"),
        (["deploy", "--version=1.15.0"], "'1.15.0' is not a version; expected v{major}"),
        (["upgrade", "--version=v1.16"], "'v1.16' is not a version"),
        (["upgrade"], "upgrade needs --version=v{major}.{feature}.{iteration}"),
        (["deploy", "--image=exporter"], "expected <component>=<image reference>"),
        (["deploy", "--namespace=Kube_System"], "--namespace=Kube_System: not a namespace name"),
        (["deploy", "--jobs-namespace=kube-system"], "the Jobs need a namespace of their own"),
        (["deploy", "--registry=https://r.example.com"], "expected a registry prefix"),
        (["deploy", "--timeout=5"], "--timeout=5: expected a duration"),
        (
            ["deploy", "--kubeconfig=/nonexistent/kubeconfig"],
            "kubeconfig /nonexistent/kubeconfig does not exist",
        ),
        (
            ["deploy", "--kubeconfig=/dev/null"],
            "kubeconfig /dev/null is not a regular file (a device or a pipe), so it holds no"
            " cluster; fix: --kubeconfig=FILE or KUBECONFIG=FILE",
        ),
        (["status", "--kubeconfig=/"], "kubeconfig / is a directory, not a kubeconfig file"),
        (
            ["deploy", "--extender", "--extender-tls-secret=tls"],
            "--extender: the extender serves beyond loopback only with TLS and an authenticated"
            " caller; give --extender-client-ca-secret=NAME",
        ),
        (
            ["precheck", "--extender-token-secret=t"],
            "--extender-token-secret=t: only with --extender",
        ),
        (["deploy", "--extender-tls-secret"], "--extender-tls-secret needs a value"),
    ],
)
def test_operator_mistakes_exit_1_with_one_clear_line(
    args: list[str], message: str, log_env: dict[str, str]
) -> None:
    result = run_script(*args, env=log_env)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_kubeconfig_from_the_environment_says_what_is_wrong_with_it(
    log_env: dict[str, str], tmp_path: Path
) -> None:
    result = run_script("status", env={**log_env, "KUBECONFIG": "/dev/null"})
    assert result.returncode == 1
    assert "kubeconfig /dev/null is not a regular file" in result.stderr
    empty = tmp_path / "kubeconfig"
    empty.write_text("")
    result = run_script("status", env={**log_env, "KUBECONFIG": str(empty)})
    assert f"kubeconfig {empty} is empty: it names no cluster" in result.stderr
    assert "does not exist" not in result.stderr


def test_missing_kubectl(log_env: dict[str, str]) -> None:
    result = run_script("status", env={**log_env, "KUBECTL": "/nonexistent/kubectl"})
    assert result.returncode == 1
    assert "kubectl not found ('/nonexistent/kubectl')" in result.stderr
    assert "set KUBECTL=" in result.stderr


def test_unreachable_cluster_names_the_server_and_logs(
    log_env: dict[str, str], tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH")
    result = run_script("verify", f"--kubeconfig={kubeconfig}", env=log_env)
    assert result.returncode == 1
    assert f"cannot reach the cluster at https://127.0.0.1:{port}" in result.stderr
    assert "fix: check --kubeconfig/KUBECONFIG" in result.stderr
    log_line = next(line for line in result.stdout.splitlines() if "log file: " in line)
    log = Path(log_line.split("log file: ", 1)[1])
    text = log.read_text()
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[verify\] ", text, re.M)
    assert "cannot reach the cluster" in text


FAKE_OLD_KUBECTL = """#!/bin/sh
# A kubectl whose cluster is Kubernetes VERSION and has nothing in it.
if [ "$1" = version ]; then
  printf '{\\n  "serverVersion": {\\n    "gitVersion": "VERSION"\\n  }\\n}\\n'
  exit 0
fi
exit 1
"""


def old_cluster_env(log_env: dict[str, str], tmp_path: Path, version: str) -> dict[str, str]:
    """deploy-all.sh's environment with a kubectl that reports a cluster of `version`."""
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_OLD_KUBECTL.replace("VERSION", version))
    kubectl.chmod(0o755)
    return {**log_env, "KUBECTL": str(kubectl)}


def test_below_the_oldest_supported_release_every_command_is_refused(
    log_env: dict[str, str], tmp_path: Path
) -> None:
    oldest = re.search(
        r"^K8S_OLDEST_VERSION=v1\.(\d+)\.", (ROOT / "hack" / "versions.env").read_text(), re.M
    )
    assert oldest is not None
    minor = int(oldest.group(1))
    assert minor == OLDEST_MINOR  # the chart's kubeVersion says the same
    chart = ROOT / "deploy" / "helm" / "lj-runtimekit" / "Chart.yaml"
    assert f"kubeVersion: '>=1.{minor}.0-0'" in chart.read_text()
    env = old_cluster_env(log_env, tmp_path, f"v1.{minor - 1}.9")
    for command in ("precheck", "deploy"):
        result = run_script(command, env=env)
        assert result.returncode == 1
        assert f"older than 1.{minor}, the oldest supported" in result.stderr
        assert "Traceback" not in result.stderr


def test_below_1_30_admission_policies_are_a_problem_unless_left_out(
    log_env: dict[str, str], tmp_path: Path
) -> None:
    """Kubernetes < 1.30 has no ValidatingAdmissionPolicy v1 and no node name in tokens:
    precheck names it, deploy refuses, and --no-admission-policies turns it into a warning."""
    env = old_cluster_env(log_env, tmp_path, "v1.29.4")
    precheck = run_script("precheck", env=env)
    assert precheck.returncode == 1
    assert "PROBLEM Kubernetes v1.29.4 is older than 1.30" in precheck.stdout
    assert "--no-admission-policies" in precheck.stdout
    deploy = run_script("deploy", env=env)
    assert deploy.returncode == 1
    assert "older than 1.30" in deploy.stderr
    assert "deploy with --no-admission-policies" in deploy.stderr
    accepted = run_script("precheck", "--no-admission-policies", env=env)
    assert "older than 1.30" not in accepted.stdout
    assert "warning: --no-admission-policies: the Controller may create any Job" in (
        accepted.stdout
    )


FAKE_KUBECTL_VERSIONS = """#!/bin/sh
# A kubectl of version CLIENT whose cluster is Kubernetes SERVER and has nothing in it.
if [ "$1" = version ]; then
  printf '{\\n  "clientVersion": {\\n    "major": "1",\\n    "gitVersion": "CLIENT"\\n  },\\n'
  printf '  "kustomizeVersion": "v5.7.1",\\n'
  printf '  "serverVersion": {\\n    "gitVersion": "SERVER"\\n  }\\n}\\n'
  exit 0
fi
exit 1
"""


@pytest.mark.parametrize(
    ("client", "server", "line"),
    [
        (
            "v1.34.4",
            "v1.34.4",
            "ok      kubectl v1.34.4 against the server v1.34.4: within one minor",
        ),
        ("v1.35.0", "v1.34.2-eks-113cf36", "ok      kubectl v1.35.0 against the server"),
        ("v1.33.1", "v1.34.4+k3s1", "ok      kubectl v1.33.1 against the server v1.34.4+k3s1"),
        (
            "v1.36.0",
            "v1.34.4",
            "warning: kubectl v1.36.0 is 2 minor versions newer than the server v1.34.4; kubectl"
            " supports one minor either side (1.33 to 1.35)",
        ),
        (
            "v1.30.2",
            "v1.34.4",
            "warning: kubectl v1.30.2 is 4 minor versions older than the server v1.34.4",
        ),
        ("", "v1.34.4", "warning: cannot compare kubectl's version 'unknown' with the server's"),
    ],
)
def test_precheck_reports_the_kubectl_version_skew(
    client: str, server: str, line: str, log_env: dict[str, str], tmp_path: Path
) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL_VERSIONS.replace("CLIENT", client).replace("SERVER", server))
    kubectl.chmod(0o755)
    result = run_script("precheck", env={**log_env, "KUBECTL": str(kubectl)})
    assert line in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.mark.controlplane
def test_precheck_fails_where_pod_security_refuses_the_node_agents(
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    log_env: dict[str, str],
) -> None:
    """The Device Plugin's and Exporter's namespace and the Jobs' namespace must admit
    hostPath volumes (Pod Security privileged): precheck names the label and the fix."""
    core = k8s_client.CoreV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {ENFORCE: "restricted"}}})
    jobs = f"{namespace}-jobs"
    core.create_namespace({"metadata": {"name": jobs, "labels": {ENFORCE: "baseline"}}})
    env = {
        **log_env,
        "KUBECTL": str(find_tools(("kubectl",))["kubectl"]),
        "KUBECONFIG": str(control_plane.kubeconfig_path),
    }
    args = [
        f"--namespace={namespace}",
        f"--jobs-namespace={jobs}",
        *(() if POLICIES_SERVED else ("--no-admission-policies",)),
    ]
    try:
        result = run_script("precheck", *args, env=env, timeout=180)
        assert result.returncode == 1
        assert (
            f"PROBLEM namespace {namespace} enforces Pod Security 'restricted' (label"
            f" {ENFORCE}=restricted), but the Device Plugin and the Exporter pods mount host"
            " paths, which only 'privileged' admits; fix: kubectl label --overwrite namespace"
            f" {namespace} {ENFORCE}=privileged"
        ) in result.stdout
        assert (
            f"PROBLEM namespace {jobs} enforces Pod Security 'baseline' (label {ENFORCE}=baseline),"
            " but the Controller's Job Agent pods (--jobs-namespace) mount host paths"
        ) in result.stdout
        versions = load_versions()
        assert f"ok      kubectl {versions.k8s} against the server {versions.k8s}" in result.stdout
        # The scheduler alone runs under restricted: no Pod Security line for it.
        alone = run_script(
            "precheck", "--components=scheduler-framework", *args, env=env, timeout=180
        )
        assert "Pod Security" not in alone.stdout
        for name in (namespace, jobs):
            core.patch_namespace(name, {"metadata": {"labels": {ENFORCE: "privileged"}}})
        fixed = run_script("precheck", *args, env=env, timeout=180)
        assert "Pod Security 'restricted'" not in fixed.stdout
        assert f"ok      namespace {namespace}: Pod Security enforce 'privileged'" in fixed.stdout
        assert f"ok      namespace {jobs}: Pod Security enforce 'privileged'" in fixed.stdout
    finally:
        core.delete_namespace(jobs, propagation_policy="Background")


def test_help_lists_every_command() -> None:
    result = run_script("--help")
    assert result.returncode == 0
    for command in (
        "precheck",
        "deploy",
        "status",
        "verify",
        "upgrade",
        "rollback",
        "delete",
        "cleanup-stale-resources",
    ):
        assert re.search(rf"^\s+{command}\b", result.stdout, re.M), command


def _shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found is None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("shellcheck is missing (CI=true): make deps installs it")
        pytest.skip("shellcheck is not installed (make deps)")
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shellcheck_clean(script: Path) -> None:
    result = subprocess.run(
        [_shellcheck(), "--severity=style", "--external-sources", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout
    assert os.access(script, os.X_OK)


# -- Dockerfiles ------------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, f"{path}: dangling line continuation"
    return out


IMAGES = {
    image.repository.removeprefix("lj-runtimekit-"): c for c in COMPONENTS for image in c.images
}
UV_VERSION = re.search(r"^UV_VERSION=(\S+)", (ROOT / "hack/bootstrap.sh").read_text(), re.M)


def test_every_image_has_a_dockerfile() -> None:
    assert {p.name.removesuffix(".Dockerfile") for p in DOCKER_DIR.glob("*.Dockerfile")} == set(
        IMAGES
    )


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_rules(image: str) -> None:
    path = DOCKER_DIR / f"{image}.Dockerfile"
    steps = instructions(path)
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in steps if k == "ARG" and "=" in a}
    # Pinned bases: an exact Python patch release on a named Debian, the uv of hack/bootstrap.sh.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", args["PYTHON_IMAGE"])
    assert UV_VERSION is not None
    assert args["UV_VERSION"] == UV_VERSION.group(1)
    froms = [a for k, a in steps if k == "FROM"]
    assert froms == [
        "ghcr.io/astral-sh/uv:${UV_VERSION} AS uv",
        "${PYTHON_IMAGE} AS build",
        "${PYTHON_IMAGE}",
    ], "multi-stage: uv, build, runtime"
    final = steps[max(i for i, (k, _) in enumerate(steps) if k == "FROM") :]
    build = steps[: len(steps) - len(final)]
    build_run = " ".join(a for k, a in build if k == "RUN")
    component = IMAGES[image]
    dist = tomllib.loads((ROOT / component.member / "pyproject.toml").read_text())["project"]
    assert f"uv build --wheel --out-dir /wheels {component.member}" in build_run
    assert "uv export --frozen --no-dev" in build_run
    assert f"--package {dist['name']}" in build_run
    # The runtime stage: only the built environment, labels, a non-root user, the script.
    assert [a for k, a in final if k == "COPY"] == [
        "--from=build /opt/lj-runtimekit /opt/lj-runtimekit"
    ]
    assert not [a for k, a in final if k == "RUN"]
    final_args = {a.split("=", 1)[0] for k, a in final if k == "ARG"}
    assert {"VERSION", "GIT_REVISION"} <= final_args
    labels = " ".join(a for k, a in final if k == "LABEL")
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert 'org.opencontainers.image.revision="${GIT_REVISION}"' in labels
    user = [a for k, a in final if k == "USER"]
    assert user
    assert user[-1].split(":")[0] not in {"0", "root"}
    entrypoint = json.loads(next(a for k, a in final if k == "ENTRYPOINT"))
    assert entrypoint[0] in dist["scripts"], f"{entrypoint} is not a console script of {dist}"
    ignore = (DOCKER_DIR / f"{image}.Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "**/build", "**/tests"} <= set(ignore)


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_lock_exports_the_image_dependencies(component: object) -> None:
    member = getattr(component, "member")  # noqa: B009
    dist = tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]["name"]
    uv = shutil.which("uv")
    argv = [uv] if uv else [sys.executable, "-m", "uv"]
    result = subprocess.run(
        [
            *argv,
            "export",
            "--frozen",
            "--no-dev",
            "--no-emit-workspace",
            "--no-hashes",
            "--package",
            dist,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "lj-runtimekit" not in result.stdout.replace("lj-runtimekit-", "")


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_component_make_targets(component: object) -> None:
    member = ROOT / getattr(component, "member")  # noqa: B009
    name = getattr(component, "name")  # noqa: B009
    if not (member / "Makefile").exists():
        pytest.skip(f"{member.name}/Makefile does not exist yet")
    result = subprocess.run(
        ["make", "-n", "-C", str(member), "docker", "deploy"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"bash ../deploy/docker/build.sh {name}" in result.stdout
    assert f"bash ../deploy/deploy-all.sh deploy --components={name}" in result.stdout


# -- hack/node-precheck.sh ---------------------------------------------------------------------


class Kubelet(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": []}).encode()
        self.send_response(200 if self.path == "/pods" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def node_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lj", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_node_precheck_passes_on_a_ready_node_and_names_each_problem(node_dir: Path) -> None:
    sockets = node_dir / "sockets"
    sockets.mkdir()
    plugins = node_dir / "plugins"
    plugins.mkdir()
    containerd = node_dir / "config.toml"
    containerd.write_text(
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.lj-runtime]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), Kubelet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {"LJ_RUNTIME_CTL": f"{sys.executable} -m lj_runtimekit.proto.cmd.runtime_ctl.main"}
    kubelet_sock = socket.socket(socket.AF_UNIX)
    kubelet_sock.bind(str(plugins / "kubelet.sock"))
    args = [
        f"--socket-dir={sockets}",
        f"--kubelet-url=http://127.0.0.1:{server.server_address[1]}/pods",
        f"--plugin-dir={plugins}",
        f"--containerd-config={containerd}",
    ]
    script = ROOT / "hack/node-precheck.sh"
    try:
        with SimulatorProcess(
            sockets, ROOT / "hack/runtime-sim/examples/nodes/tdm-8gpu.yaml", version="v1.14.0"
        ):
            good = run_script(*args, env=env, script=script)
            assert good.returncode == 0, good.stdout + good.stderr
            assert "ok      Runtime v1.14.0 >= v1.13.0" in good.stdout
            assert "topology-aware gang scheduling needs v1.15.0" in good.stdout
            assert "kubelet read-only port answers" in good.stdout
        kubelet_sock.close()
        (plugins / "kubelet.sock").unlink()
        containerd.write_text("")
        server.shutdown()
        server.server_close()
        bad = run_script(*args, env=env, script=script)
    finally:
        kubelet_sock.close()
        server.server_close()
    assert bad.returncode == 1
    problems = [line for line in bad.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 3, bad.stdout
    assert f"no Runtime socket {sockets}/runtime.sock" in problems[0]
    assert "kubelet.sock" in problems[1]
    assert "no lj-runtime runtime handler" in problems[2]
    # The kubelet read-only port is optional: a warning naming the deploy option.
    warnings = [line for line in bad.stdout.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1, bad.stdout
    assert "kubelet read-only port does not answer" in warnings[0]
    assert "--no-kubelet-read-only-port" in warnings[0]
