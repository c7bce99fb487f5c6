"""The checkpoint of prepared claims: what each holds in the Runtime and what the kubelet was
answered, so that a restarted plugin prepares nothing twice and leaks nothing.

One small JSON file per claim, `<directory>/claims/<uid>.json`, so that recording or
forgetting a claim writes that claim only, whatever else is held. Each is written to a
hidden temporary file, synced and renamed; a SHA-256 checksum of its entry tells a
damaged file from a good one. A removal syncs the directory: a forgotten claim must not
come back after a crash (it would be allocated again for nobody), while a recorded one
that a crash loses is only prepared again when the kubelet repeats it. The single file
of earlier versions (`checkpoint.json`) is read once and split into per-claim files.
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

CLAIMS_DIR = "claims"
VERSION = 2
LEGACY_FILE = "checkpoint.json"
LEGACY_VERSION = 1
"""The single file of every claim, written before per-claim files."""


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
                "shareID": d.share_id,
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
                str(d.get("shareID", "")),  # not in entries written before shares had IDs
            )
            for d in raw["devices"]
        ),
        tuple(_decode_share(s) for s in raw["shares"]),
        str(raw["cdi"]),
    )


def _checksum(entry: Any) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpoint:
    """Prepared claims by UID, one file each under `<directory>/claims/` (blocking I/O;
    calls for different claims may run at once, in threads)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / CLAIMS_DIR
        self.legacy_path = directory / LEGACY_FILE
        self._claims: dict[str, PreparedClaim] = {}

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """The prepared claims by UID (a copy)."""
        return dict(self._claims)

    def get(self, uid: str) -> PreparedClaim | None:
        """The prepared claim of a UID, if recorded."""
        return self._claims.get(uid)

    def path(self, uid: str) -> Path:
        """The file of a claim."""
        return self.directory / f"{uid}.json"

    def load(self) -> None:
        """Read every claim's file (none yet: no claims); CheckpointError, naming the file,
        when one is damaged. A file of an earlier version is split into claim files first."""
        if self.legacy_path.exists():
            self._split_legacy()
        claims: dict[str, PreparedClaim] = {}
        if self.directory.is_dir():
            for tmp in self.directory.glob(".*.tmp"):  # a write a crash interrupted
                with contextlib.suppress(OSError):
                    tmp.unlink()
            for path in sorted(self.directory.glob("*.json")):
                claim = self._read(path)
                claims[claim.ref.uid] = claim
        self._claims = claims

    def _read(self, path: Path) -> PreparedClaim:
        doc = _read_json(path)
        try:
            if doc["version"] != VERSION:
                raise CheckpointError(
                    f"checkpoint {path} has version {doc['version']}, expected {VERSION}"
                )
            entry = doc["claim"]
            if _checksum(entry) != doc["checksum"]:
                raise CheckpointError(f"checkpoint {path} does not match its checksum")
            uid = str(entry["uid"])
            if path.name != f"{uid}.json":
                raise CheckpointError(f"checkpoint {path} holds claim UID {uid}")
            return _decode(uid, entry)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {path} is malformed: {exc!r}") from exc

    def _split_legacy(self) -> None:
        path = self.legacy_path
        doc = _read_json(path)
        try:
            if doc["version"] != LEGACY_VERSION:
                raise CheckpointError(
                    f"checkpoint {path} has version {doc['version']}, expected {LEGACY_VERSION}"
                )
            entries = doc["claims"]
            if _checksum(entries) != doc["checksum"]:
                raise CheckpointError(f"checkpoint {path} does not match its checksum")
            claims = [_decode(uid, raw) for uid, raw in entries.items()]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {path} is malformed: {exc!r}") from exc
        for claim in claims:
            self.put(claim)
        try:
            if claims:
                _sync_dir(self.directory)  # every claim's file there before the file goes
            path.unlink()
            _sync_dir(path.parent)
        except OSError as exc:
            raise CheckpointError(f"cannot remove checkpoint {path}: {exc}") from exc

    def put(self, claim: PreparedClaim) -> None:
        """Record a prepared claim: write its file."""
        uid = claim.ref.uid
        entry = {"uid": uid, **_encode(claim)}
        doc = {"version": VERSION, "checksum": _checksum(entry), "claim": entry}
        path = self.path(uid)
        tmp = self.directory / f".{path.name}.tmp"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(json.dumps(doc, sort_keys=True).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise CheckpointError(f"cannot write checkpoint {path}: {exc}") from exc
        self._claims[uid] = claim

    def drop(self, uid: str) -> None:
        """Forget a claim: remove its file (nothing when it is not recorded)."""
        if uid not in self._claims:
            return
        path = self.path(uid)
        try:
            path.unlink(missing_ok=True)
            _sync_dir(self.directory)
        except OSError as exc:
            raise CheckpointError(f"cannot remove checkpoint {path}: {exc}") from exc
        self._claims.pop(uid, None)
