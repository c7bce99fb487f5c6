"""The checkpoint of prepared claims: what each holds in the Runtime and what the kubelet was
answered, so that a restarted plugin prepares nothing twice and leaks nothing.

One JSON file, written to a temporary file and renamed; a SHA-256 checksum of its entries
tells a damaged file from a good one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lj_runtimekit.deviceplugin.internal.dra.claims import ClaimDevice, ClaimRef
from lj_runtimekit.proto.pkg.protocol import DeviceShare

FILE_NAME = "checkpoint.json"
VERSION = 1


class CheckpointError(Exception):
    """The checkpoint cannot be read or written; the message names the file."""


@dataclass(frozen=True)
class PreparedClaim:
    """A prepared claim: its devices as answered to the kubelet, the shares the Runtime
    holds for it, and its CDI device name."""

    ref: ClaimRef
    devices: tuple[ClaimDevice, ...]
    shares: tuple[DeviceShare, ...]
    cdi_device_id: str


def _share(s: DeviceShare) -> dict[str, Any]:
    return {"id": s.device_id, "cores": s.core_percent, "memory": s.memory_percent}


def _encode(claim: PreparedClaim) -> dict[str, Any]:
    return {
        "namespace": claim.ref.namespace,
        "name": claim.ref.name,
        "devices": [
            {
                "requests": list(d.request_names),
                "pool": d.pool,
                "device": d.device,
                "share": _share(d.share),
            }
            for d in claim.devices
        ],
        "shares": [_share(s) for s in claim.shares],
        "cdi": claim.cdi_device_id,
    }


def _decode_share(raw: Mapping[str, Any]) -> DeviceShare:
    return DeviceShare(str(raw["id"]), int(raw["cores"]), int(raw["memory"]))


def _decode(uid: str, raw: Mapping[str, Any]) -> PreparedClaim:
    return PreparedClaim(
        ClaimRef(str(raw["namespace"]), str(raw["name"]), uid),
        tuple(
            ClaimDevice(
                tuple(str(r) for r in d["requests"]),
                str(d["pool"]),
                str(d["device"]),
                _decode_share(d["share"]),
            )
            for d in raw["devices"]
        ),
        tuple(_decode_share(s) for s in raw["shares"]),
        str(raw["cdi"]),
    )


def _checksum(entries: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    """Prepared claims by UID, kept in `<directory>/checkpoint.json` (blocking I/O)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self._claims: dict[str, PreparedClaim] = {}

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """The prepared claims by UID."""
        return dict(self._claims)

    def load(self) -> None:
        """Read the file (none yet: no claims); CheckpointError when it is damaged."""
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            self._claims = {}
            return
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is unreadable: {exc}") from exc
        try:
            if doc["version"] != VERSION:
                raise CheckpointError(
                    f"checkpoint {self.path} has version {doc['version']}, expected {VERSION}"
                )
            entries = doc["claims"]
            if _checksum(entries) != doc["checksum"]:
                raise CheckpointError(f"checkpoint {self.path} does not match its checksum")
            self._claims = {uid: _decode(uid, raw) for uid, raw in entries.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is malformed: {exc!r}") from exc

    def put(self, claim: PreparedClaim) -> None:
        """Record a prepared claim and write the file."""
        claims = {**self._claims, claim.ref.uid: claim}
        self._write(claims)
        self._claims = claims

    def drop(self, uid: str) -> None:
        """Forget a claim and write the file (nothing when it is not recorded)."""
        if uid not in self._claims:
            return
        claims = {k: v for k, v in self._claims.items() if k != uid}
        self._write(claims)
        self._claims = claims

    def _write(self, claims: Mapping[str, PreparedClaim]) -> None:
        entries = {uid: _encode(c) for uid, c in claims.items()}
        doc = {"version": VERSION, "checksum": _checksum(entries), "claims": entries}
        tmp = self.path.with_name(f".{FILE_NAME}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(json.dumps(doc, indent=1, sort_keys=True).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise CheckpointError(f"cannot write checkpoint {self.path}: {exc}") from exc
