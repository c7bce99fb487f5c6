"""Kueue's manager (`sigs.k8s.io/kueue/cmd/kueue`, built by hack/k8s-tools.sh) against an
envtest ControlPlane:

    with ControlPlane(ControlPlaneConfig()) as cp:
        binary = find_tools(("kueue",), cp.config.version)["kueue"]
        with Kueue(cp, binary) as kueue:
            kueue.manage(namespace)  # Kueue gates and admits queued pods there

The binary comes from the caller (lj_runtimekit.envtest.find_tools): the test kit does
not import envtest at run time (envtest imports the test kit; hack/import_contracts.py).
A control plane known only by its kubeconfig (the DRA bed's) is given as a
`KubeconfigPlane`.

The API server runs on loopback with no service network, so every webhook Kueue serves
(admission and CRD conversion) is registered with `clientConfig.url` on 127.0.0.1 and the
CA of certificates made here. Kueue runs with its internal certificate management on, as
its default install does (with it off, Kueue 0.17 reads a metrics certificate from the
fixed path /etc/kueue/metrics/certs). Its certificate rotator keeps the certificates it
finds in its Secret when they are valid for it (a CA with a PKCS#1 RSA key and the DNS
name `kueue-ca`; a serving certificate for the webhook Service's DNS name; both good for
more than 90 days), so the Secret is seeded with the certificates made here, whose
serving certificate also names 127.0.0.1, and the rotator writes that same CA into the
webhook registrations and the CRDs' conversion webhooks.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch
from kubernetes.client.rest import ApiException

from lj_runtimekit.testkit.ports import free_port
from lj_runtimekit.testkit.waits import NotYet, WaitTimeout, wait_for

GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
NAMESPACE = "kueue-system"
"""Kueue's own namespace (its Configuration's `namespace`): the certificate Secret."""
MANAGED_LABEL = "envtest.lj-runtimekit.io/kueue"
"""A namespace labelled `MANAGED_LABEL=managed` is one whose pods and Jobs Kueue manages
(`Kueue.manage`); the job webhooks apply there only."""
SCHEDULING_GATE = "kueue.x-k8s.io/admission"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"

_SERVICE = "kueue-webhook-service"
_CERT_SECRET = "kueue-webhook-server-cert"  # noqa: S105 (a Secret's name)
_CA_NAME = "kueue-ca"
_CONVERTED_CRDS = (
    "localqueues",
    "clusterqueues",
    "cohorts",
    "workloads",
    "multikueueclusters",
)
"""The CRDs Kueue's install gives a conversion webhook (config/components/crd) and its
certificate rotator writes the CA into; it waits until it has written them all."""
_WEBHOOK_CONFIGURATIONS = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
"""Kueue's names for its webhook configurations (its rotator writes the CA into these)."""


class KueueError(RuntimeError):
    """Kueue could not be set up or did not come up; the message names what and its log."""


class Plane(Protocol):
    """What Kueue needs of a control plane (lj_runtimekit.envtest's ControlPlane has it)."""

    @property
    def kubeconfig_path(self) -> Path: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def log_dir(self) -> Path: ...
    def api_client(self) -> k8s_client.ApiClient: ...
    def kubectl_argv(self, *args: str) -> list[str]: ...


@dataclass(frozen=True)
class KubeconfigPlane:
    """A control plane given by its admin kubeconfig and the kubectl binary for its
    release; Kueue's state and log go beside the kubeconfig (an envtest ControlPlane's
    state directory, whose logs/ it keeps)."""

    kubeconfig_path: Path
    kubectl: Path

    @property
    def state_dir(self) -> Path:
        return self.kubeconfig_path.parent

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def api_client(self) -> k8s_client.ApiClient:
        return k8s_config.new_client_from_config(str(self.kubeconfig_path))

    def kubectl_argv(self, *args: str) -> list[str]:
        return [str(self.kubectl), f"--kubeconfig={self.kubeconfig_path}", *args]


def _run_openssl(directory: Path, *args: str) -> None:
    if shutil.which("openssl") is None:
        raise KueueError("the openssl command is needed to make Kueue's certificates")
    result = subprocess.run(
        ["openssl", *args], cwd=directory, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise KueueError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_certificates(directory: Path) -> None:
    """Writes ca.crt, ca.key (RSA, PKCS#1), tls.crt and tls.key into `directory`: a CA
    named as Kueue's rotator names its own and a serving certificate for the webhook
    Service's DNS name and 127.0.0.1, both valid ten years."""
    directory.mkdir(parents=True, exist_ok=True)
    service_dns = f"{_SERVICE}.{NAMESPACE}.svc"
    _run_openssl(directory, "genrsa", "-traditional", "-out", "ca.key", "2048")
    _run_openssl(
        directory,
        *("req", "-x509", "-new", "-key", "ca.key", "-days", "3650", "-sha256"),
        *("-subj", f"/O=kueue/CN={_CA_NAME}", "-out", "ca.crt"),
        *("-addext", f"subjectAltName=DNS:{_CA_NAME}"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,digitalSignature,keyEncipherment"),
    )
    _run_openssl(
        directory,
        *("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
        *("-noenc", "-keyout", "tls.key", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-days", "3650", "-sha256", "-subj", f"/CN={service_dns}", "-out", "tls.crt"),
        *("-addext", f"subjectAltName=DNS:{service_dns},IP:127.0.0.1"),
        *("-addext", "basicConstraints=CA:FALSE"),
        *("-addext", "keyUsage=critical,digitalSignature,keyEncipherment"),
        *("-addext", "extendedKeyUsage=serverAuth"),
    )
    (directory / "ca.key").chmod(0o600)
    (directory / "tls.key").chmod(0o600)


def _is(exc: ApiException, status: int) -> bool:
    return int(exc.status or 0) == status


class Kueue:
    """Kueue's manager `binary` for `control_plane`: CRDs, webhooks and certificates set
    up by `start` (the CRDs and webhook manifests from kueue-config/ next to the binary),
    the process stopped and the webhook registrations removed by `stop`. `frameworks` are
    Kueue integration names. The state (configuration, certificates) lives in the control
    plane's state directory, the log beside its components' logs."""

    def __init__(
        self,
        control_plane: Plane,
        binary: Path,
        *,
        frameworks: tuple[str, ...] = ("batch/job", "pod"),
        feature_gates: Mapping[str, bool] | None = None,
        device_class_mappings: Mapping[str, Sequence[str]] | None = None,
        start_timeout_s: float = 90.0,
    ) -> None:
        self.control_plane = control_plane
        self.binary = binary
        self.manifests = binary.parent / "kueue-config"
        self.frameworks = frameworks
        self.feature_gates = dict(feature_gates or {})
        """Kueue feature gates on top of VisibilityOnDemand off (e.g.
        `{"DynamicResourceAllocation": True}`)."""
        self.device_class_mappings = dict(device_class_mappings or {})
        """Configuration `resources.deviceClassMappings`: the resource name quota is kept
        in -> the DeviceClasses whose devices count as it (DynamicResourceAllocation)."""
        self.start_timeout_s = start_timeout_s
        self.state_dir = control_plane.state_dir / "kueue"
        self.log_path = control_plane.log_dir / "kueue.log"
        self.webhook_port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._api: k8s_client.ApiClient | None = None

    @property
    def version(self) -> str:
        """The Kueue module version the CRDs and webhook manifests come from."""
        return (self.manifests / "VERSION").read_text().strip()

    @property
    def api(self) -> k8s_client.ApiClient:
        """The admin ApiClient used to set Kueue up (open between start and stop)."""
        if self._api is None:
            raise KueueError("Kueue is not started")
        return self._api

    def start(self) -> Kueue:
        """Sets up CRDs, certificates and webhooks, starts the manager and waits until it
        is ready and its webhooks answer through the API server."""
        if self._process is not None:
            return self
        if not (self.manifests / "crd").is_dir():
            raise KueueError(
                f"Kueue's CRDs are missing from {self.manifests}; run `make k8s-tools`"
            )
        self._api = self.control_plane.api_client()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Removes the webhook registrations (no pod waits on a stopped Kueue), then stops
        the manager. The CRDs and Kueue's objects stay."""
        try:
            if self._api is not None:
                self._delete_webhooks()
        finally:
            if self._process is not None:
                self._process.terminate()
                try:
                    self._process.wait(15)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
                self._process = None
            if self._api is not None:
                self._api.close()
                self._api = None

    def manage(self, namespace: str) -> None:
        """Labels `namespace` so that Kueue manages its queued pods and Jobs."""
        k8s_client.CoreV1Api(self.api).patch_namespace(
            namespace, {"metadata": {"labels": {MANAGED_LABEL: "managed"}}}
        )

    def apply(self, path: Path) -> None:
        """`kubectl apply -f path` against the control plane (KueueError with kubectl's
        output when it fails)."""
        argv = self.control_plane.kubectl_argv("apply", "-f", str(path))
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise KueueError(f"kubectl apply -f {path} failed: {result.stderr.strip()}")

    def wait_local_queue_active(self, namespace: str, name: str, timeout_s: float = 30) -> None:
        """Waits until the LocalQueue (and so its ClusterQueue) is Active."""
        custom = k8s_client.CustomObjectsApi(self.api)

        def active() -> bool | NotYet:
            lq = custom.get_namespaced_custom_object(
                GROUP, API_VERSION, namespace, "localqueues", name
            )
            conditions = lq.get("status", {}).get("conditions", [])
            ok = any(c["type"] == "Active" and c["status"] == "True" for c in conditions)
            return ok or NotYet(f"LocalQueue conditions {conditions}")

        wait_for(active, timeout_s, f"LocalQueue {namespace}/{name} Active")

    def check_running(self) -> None:
        """Raises KueueError with the log tail when the manager has exited."""
        if self._process is None:
            raise KueueError("Kueue is not started")
        code = self._process.poll()
        if code is not None:
            raise KueueError(f"Kueue exited with status {code}; {self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return f"no log at {self.log_path}"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"last lines of {self.log_path}:\n{tail}"

    def __enter__(self) -> Kueue:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- start-up ---------------------------------------------------------------------------

    def _start(self) -> None:
        self.webhook_port, self.health_port, self.metrics_port = (
            free_port(),
            free_port(),
            free_port(),
        )
        certs = self.state_dir / "certs"
        make_certificates(certs)
        ca_bundle = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
        self._apply_crds(ca_bundle)
        self._seed_secret(certs)
        self._apply_webhooks(ca_bundle)
        config = self.state_dir / "config.yaml"
        config.write_text(yaml.safe_dump(self._configuration(certs), sort_keys=False))
        argv = [
            str(self.binary),
            f"--config={config}",
            f"--kubeconfig={self.control_plane.kubeconfig_path}",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"# {' '.join(argv)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait(self._readyz, f"readyz at http://127.0.0.1:{self.health_port}/readyz")
        self._wait(self._webhooks_answer, "its webhooks through the API server")

    def _configuration(self, certs: Path) -> dict[str, Any]:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": _SERVICE,
                "webhookSecretName": _CERT_SECRET,
            },
            "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: "managed"}},
            "integrations": {"frameworks": list(self.frameworks)},
            # The visibility API server would bind a fixed port and need an APIService.
            "featureGates": {"VisibilityOnDemand": False, **self.feature_gates},
        } | self._resources()

    def _resources(self) -> dict[str, Any]:
        if not self.device_class_mappings:
            return {}
        mappings = [
            {"name": name, "deviceClassNames": list(classes)}
            for name, classes in self.device_class_mappings.items()
        ]
        return {"resources": {"deviceClassMappings": mappings}}

    def _url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.webhook_port}{path}"

    def _apply_crds(self, ca_bundle: str) -> None:
        ext = k8s_client.ApiextensionsV1Api(self.api)
        names: list[str] = []
        for path in sorted((self.manifests / "crd").glob("*.yaml")):
            crd: dict[str, Any] = yaml.safe_load(path.read_text())
            if crd["spec"]["names"]["plural"] in _CONVERTED_CRDS:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": self._url("/convert"), "caBundle": ca_bundle},
                        "conversionReviewVersions": ["v1"],
                    },
                }
            name = crd["metadata"]["name"]
            try:
                ext.create_custom_resource_definition(crd)
            except ApiException as exc:
                if not _is(exc, 409):
                    raise
                current = ext.read_custom_resource_definition(name)
                crd["metadata"]["resourceVersion"] = current.metadata.resource_version
                ext.replace_custom_resource_definition(name, crd)
            names.append(name)

        def established() -> bool | NotYet:
            for name in names:
                conditions = ext.read_custom_resource_definition(name).status.conditions or []
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return NotYet(f"{name} not Established")
            return True

        wait_for(established, 30, "Kueue's CRDs Established")

    def _seed_secret(self, certs: Path) -> None:
        core = k8s_client.CoreV1Api(self.api)
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as exc:
            if not _is(exc, 409):
                raise
        data = {
            name: base64.b64encode((certs / name).read_bytes()).decode()
            for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")
        }
        secret = {"metadata": {"name": _CERT_SECRET, "namespace": NAMESPACE}, "data": data}
        try:
            core.create_namespaced_secret(NAMESPACE, secret)
        except ApiException as exc:
            if not _is(exc, 409):
                raise
            core.replace_namespaced_secret(_CERT_SECRET, NAMESPACE, secret)

    def _apply_webhooks(self, ca_bundle: str) -> None:
        text = (self.manifests / "webhook" / "manifests.yaml").read_text()
        admission = k8s_client.AdmissionregistrationV1Api(self.api)
        self._delete_webhooks()
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            doc["metadata"]["name"] = _WEBHOOK_CONFIGURATIONS[doc["kind"]]
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": self._url(path), "caBundle": ca_bundle}
                groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
                if groups != {GROUP}:
                    # A job integration's webhook: only where Kueue manages jobs.
                    hook["namespaceSelector"] = {"matchLabels": {MANAGED_LABEL: "managed"}}
            if doc["kind"] == "MutatingWebhookConfiguration":
                admission.create_mutating_webhook_configuration(doc)
            else:
                admission.create_validating_webhook_configuration(doc)

    def _delete_webhooks(self) -> None:
        admission = k8s_client.AdmissionregistrationV1Api(self.api)
        deletes = {
            "MutatingWebhookConfiguration": admission.delete_mutating_webhook_configuration,
            "ValidatingWebhookConfiguration": admission.delete_validating_webhook_configuration,
        }
        for kind, name in _WEBHOOK_CONFIGURATIONS.items():
            try:
                deletes[kind](name)
            except ApiException as exc:
                if not _is(exc, 404):
                    raise

    # -- readiness --------------------------------------------------------------------------

    def _wait(self, condition: Callable[[], bool | NotYet], what: str) -> None:
        """Waits for `condition`; KueueError naming `what` and the log when the manager
        exits first or time runs out."""

        def alive_and() -> bool | NotYet:
            self.check_running()
            return condition()

        try:
            wait_for(alive_and, self.start_timeout_s, what, interval_s=0.3)
        except KueueError as exc:
            raise KueueError(f"Kueue did not come up (waiting for {what}): {exc}") from None
        except WaitTimeout as exc:
            raise KueueError(f"Kueue did not come up: {exc}; {self._log_tail()}") from None

    def _readyz(self) -> bool | NotYet:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200) or NotYet(f"HTTP {resp.status}")
        except urllib.error.HTTPError as exc:
            return NotYet(f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}")
        except (urllib.error.URLError, OSError) as exc:
            return NotYet(str(exc))

    def _webhooks_answer(self) -> bool | NotYet:
        """A dry-run ResourceFlavor passes Kueue's mutating and validating webhooks."""
        flavor = {
            "apiVersion": f"{GROUP}/{API_VERSION}",
            "kind": "ResourceFlavor",
            "metadata": {"name": "lj-envtest-webhook-probe"},
        }
        try:
            k8s_client.CustomObjectsApi(self.api).create_cluster_custom_object(
                GROUP, API_VERSION, "resourceflavors", flavor, dry_run="All"
            )
        except ApiException as exc:
            return NotYet(f"HTTP {exc.status}: {str(exc.body)[:300]}")
        return True


def gated(pod: k8s_client.V1Pod) -> bool:
    """Whether the pod still waits at Kueue's scheduling gate."""
    return any(g.name == SCHEDULING_GATE for g in pod.spec.scheduling_gates or [])


def workload_condition(
    api: k8s_client.ApiClient, namespace: str, pod_name: str, kind: str
) -> dict[str, Any] | None:
    """The condition `kind` of the Workload Kueue made for the pod (the Workload that owns
    it); None while there is no such Workload or condition."""
    uid = k8s_client.CoreV1Api(api).read_namespaced_pod(pod_name, namespace).metadata.uid
    listed = k8s_client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, API_VERSION, namespace, "workloads"
    )
    for workload in listed["items"]:
        if any(o["uid"] == uid for o in workload["metadata"].get("ownerReferences", [])):
            for cond in workload.get("status", {}).get("conditions", []):
                if cond["type"] == kind:
                    return dict(cond)
    return None


@dataclass
class _Seen:
    gated: bool
    node: str
    group: str


class PodTimeline:
    """A watch of one namespace's pods from a thread. It stamps, with time.monotonic(),
    when each pod was first seen without Kueue's gate (`ungated`) and first seen bound
    (`bound`, its node in `nodes`), and records the pod groups (POD_GROUP_LABEL) seen with
    a member bound while another member still waited at the gate (`partial_groups`: Kueue
    admits a group whole, so this stays empty). Pods gone stay in the stamps."""

    def __init__(self, api: k8s_client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.ungated: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.partial_groups: set[str] = set()
        self.error = ""
        self._core = k8s_client.CoreV1Api(api)
        self._pods: dict[str, _Seen] = {}
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-timeline", daemon=True)

    def __enter__(self) -> PodTimeline:
        self._thread.start()
        if not self._connected.wait(30):
            raise KueueError(f"the pod watch of {self.namespace} did not start: {self.error}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def snapshot(self) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
        """Copies of (ungated, bound, nodes), consistent with each other."""
        with self._lock:
            return dict(self.ungated), dict(self.bound), dict(self.nodes)

    def _seen(self, pod: k8s_client.V1Pod, now: float) -> None:
        name = pod.metadata.name
        seen = _Seen(
            gated=gated(pod),
            node=pod.spec.node_name or "",
            group=(pod.metadata.labels or {}).get(POD_GROUP_LABEL, ""),
        )
        with self._lock:
            self._pods[name] = seen
            if not seen.gated:
                self.ungated.setdefault(name, now)
            if seen.node:
                self.bound.setdefault(name, now)
                self.nodes.setdefault(name, seen.node)
            if seen.group:
                members = [p for p in self._pods.values() if p.group == seen.group]
                if any(p.node for p in members) and any(p.gated for p in members):
                    self.partial_groups.add(seen.group)

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = self._core.list_namespaced_pod(self.namespace)
                    now = time.monotonic()
                    for pod in listed.items:
                        self._seen(pod, now)
                    version = listed.metadata.resource_version
                    self._connected.set()
                stream = watch.Watch().stream(
                    self._core.list_namespaced_pod,
                    self.namespace,
                    resource_version=version,
                    timeout_seconds=5,
                )
                for event in stream:
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    if event["type"] == "DELETED":
                        with self._lock:
                            self._pods.pop(pod.metadata.name, None)
                    else:
                        self._seen(pod, time.monotonic())
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                if not _is(exc, 410):
                    self.error = f"HTTP {exc.status}: {exc.reason}"
                    self._stop.wait(1)
                version = ""
