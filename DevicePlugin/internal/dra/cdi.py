"""CDI spec files of prepared claims: one spec per claim, with one CDI device named after the
claim's UID carrying the Runtime's injection (environment, device nodes, mounts).

The container runtime reads every `*.json` in the CDI directory; a spec is written to a
hidden temporary file and renamed, so it never sees half a spec.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb

CDI_VERSION = "0.6.0"
CLAIM_CLASS = "claim"


class CdiError(OSError):
    """A CDI spec file cannot be written or removed; the message names the file."""


class CdiSpecs:
    """The CDI specs of one driver's claims in one directory."""

    def __init__(self, directory: Path, driver: str) -> None:
        self.directory = directory
        self.kind = f"{driver}/{CLAIM_CLASS}"
        self._prefix = f"{driver}-{CLAIM_CLASS}_"

    def path(self, claim_uid: str) -> Path:
        """The spec file of a claim."""
        return self.directory / f"{self._prefix}{claim_uid}.json"

    def device_id(self, claim_uid: str) -> str:
        """The fully qualified CDI device name of a claim: `<driver>/claim=<uid>`."""
        return f"{self.kind}={claim_uid}"

    def spec(self, claim_uid: str, injection: pb.InjectionSpec) -> dict[str, Any]:
        """The CDI spec of a claim's injection."""
        edits: dict[str, Any] = {
            "env": [f"{k}={v}" for k, v in sorted(injection.envs.items())],
            "deviceNodes": [
                {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions}
                for n in injection.device_nodes
            ],
            "mounts": [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": ["ro", "bind"] if m.read_only else ["rw", "bind"],
                }
                for m in injection.mounts
            ],
        }
        return {
            "cdiVersion": CDI_VERSION,
            "kind": self.kind,
            "devices": [{"name": claim_uid, "containerEdits": edits}],
        }

    def write(self, claim_uid: str, injection: pb.InjectionSpec) -> str:
        """Write a claim's spec atomically; return its CDI device name."""
        path = self.path(claim_uid)
        tmp = self.directory / f".{path.name}.tmp"
        data = json.dumps(self.spec(claim_uid, injection), indent=2).encode()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise CdiError(f"cannot write CDI spec {path}: {exc.strerror or exc}") from exc
        return self.device_id(claim_uid)

    def exists(self, claim_uid: str) -> bool:
        """True when the claim's spec file is there."""
        return self.path(claim_uid).is_file()

    def remove(self, claim_uid: str) -> None:
        """Remove a claim's spec (nothing when there is none)."""
        path = self.path(claim_uid)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise CdiError(f"cannot remove CDI spec {path}: {exc.strerror or exc}") from exc

    def claim_uids(self) -> set[str]:
        """The UIDs of every claim with a spec file in the directory."""
        if not self.directory.is_dir():
            return set()
        return {
            p.name[len(self._prefix) : -len(".json")]
            for p in self.directory.glob(f"{self._prefix}*.json")
        }
