"""Certificates and keys of a throwaway control plane, made with the openssl CLI.

ECDSA P-256 everywhere (fast to generate, accepted by every component): a CA,
one serving certificate for all components on loopback, an admin client
certificate in `system:masters`, a front-proxy client certificate signed by a
CA of its own (request header authentication, as kubeadm sets it up) and the
service-account signing key pair.

The front proxy's CA is not the client CA: the API server checks every
client certificate against the request-header CA before its x509
authenticator does, and with one CA for both that first check verified the
signature too (then refused the name). That doubled the ECDSA verification of
every request, 12 to 16 % of the API server's CPU in a CPU profile of a
scheduler benchmark run. With a CA of its own, a client certificate has no
parent there and is turned away before any signature is checked.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVICE_IP = "10.0.0.1"
FRONT_PROXY_CN = "front-proxy-client"
_DAYS = "3650"


class CertificateError(RuntimeError):
    """openssl is missing or failed; the message carries its output."""


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca_cert: Path
    front_proxy_cert: Path
    front_proxy_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise CertificateError("the openssl command is needed to generate certificates; install it")
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise CertificateError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def _ec_key(path: Path, cwd: Path) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        str(path),
        cwd=cwd,
    )
    path.chmod(0o600)


def _ca(name: str, subject: str, directory: Path) -> None:
    _ec_key(directory / f"{name}.key", directory)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        f"{name}.key",
        "-subj",
        subject,
        "-days",
        _DAYS,
        "-sha256",
        "-out",
        f"{name}.crt",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=directory,
    )


def _signed(name: str, subject: str, extensions: str, directory: Path, ca: str = "ca") -> None:
    _ec_key(directory / f"{name}.key", directory)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=directory
    )
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-days",
        _DAYS,
        "-sha256",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=directory,
    )


def generate(directory: Path) -> Pki:
    """Writes a fresh PKI into `directory` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", "/CN=lj-runtimekit-envtest-ca", directory)
    _ca("front-proxy-ca", "/CN=lj-runtimekit-envtest-front-proxy-ca", directory)
    sans = ",".join(
        [
            "IP:127.0.0.1",
            f"IP:{SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    _signed(
        "serving",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
        directory,
    )
    _signed(
        "admin",
        "/O=system:masters/CN=lj-runtimekit-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
        directory,
    )
    _signed(
        "front-proxy",
        f"/CN={FRONT_PROXY_CN}",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
        directory,
        ca="front-proxy-ca",
    )
    _ec_key(directory / "sa.key", directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return Pki(
        directory=directory,
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "serving.crt",
        serving_key=directory / "serving.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        front_proxy_ca_cert=directory / "front-proxy-ca.crt",
        front_proxy_cert=directory / "front-proxy.crt",
        front_proxy_key=directory / "front-proxy.key",
    )
