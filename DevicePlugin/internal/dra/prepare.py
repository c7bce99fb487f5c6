"""NodePrepareResources and NodeUnprepareResources against the Runtime.

A claim is allocated once in the Runtime as a holder of its own (container key
`claim/<uid>`), however many containers and pods share it; its injection becomes a CDI
spec, and the claim is recorded in the checkpoint. A refusal leaves nothing held and no
CDI spec. Claims are locked one by one; claims of one request are prepared concurrently.
On start the checkpoint is reconciled with the Runtime's claim allocations, and again
whenever the Runtime comes back (it may have restarted without them).

A prepare costs the same however many claims are held: devices are resolved against the
inventory the slice publisher follows (the Runtime is asked only when that is unknown or
does not name a claim's device) and the checkpoint writes the one claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from lj_runtimekit.deviceplugin.internal.dra.cdi import CdiError, CdiSpecs
from lj_runtimekit.deviceplugin.internal.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
)
from lj_runtimekit.deviceplugin.internal.dra.claims import (
    ClaimDevice,
    ClaimError,
    ClaimRef,
    claim_devices,
    merged_shares,
    read_claim,
)
from lj_runtimekit.proto.lingjun.runtime.v1 import runtime_pb2 as pb
from lj_runtimekit.proto.pkg.kube import (
    KubeClient,
    KubeError,
    KubeObject,
    NotFoundError,
    call_async,
)
from lj_runtimekit.proto.pkg.kube import RetryPolicy as KubeRetryPolicy
from lj_runtimekit.proto.pkg.runtimeclient import (
    RuntimeCallError,
    RuntimeClient,
    RuntimeUnavailableError,
    to_request,
)

log = logging.getLogger(__name__)

CLAIM_KEY_PREFIX = "claim/"
KUBE_RETRY = KubeRetryPolicy(attempts=4, timeout_s=15.0, initial_s=0.2, jitter_s=0.2)
"""Reading a claim: bounded well inside the kubelet's 45 s per call."""


def container_key(claim_uid: str) -> str:
    """The Runtime's key of a claim's allocation."""
    return CLAIM_KEY_PREFIX + claim_uid


@dataclass(frozen=True)
class Reconciled:
    """What a start's reconciliation did: claims allocated again (the Runtime had lost
    them), claim allocations released (no checkpoint entry and no such claim), CDI specs
    removed (no checkpoint entry)."""

    reallocated: tuple[str, ...]
    released: tuple[str, ...]
    removed_specs: tuple[str, ...]


class _KeyedLocks:
    """One lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class Preparer:
    """Prepares and unprepares the claims of one node (pool) of one driver."""

    def __init__(
        self,
        kube: KubeClient,
        runtime: RuntimeClient,
        driver: str,
        pool: str,
        cdi: CdiSpecs,
        checkpoint: Checkpoint,
        *,
        inventory: Callable[[], Sequence[pb.Device] | None] | None = None,
        kube_retry: KubeRetryPolicy = KUBE_RETRY,
    ) -> None:
        """`inventory`: the Runtime's devices as last seen (None: not known yet); without
        it every claim reads them from the Runtime."""
        self._kube = kube
        self._runtime = runtime
        self.driver = driver
        self.pool = pool
        self._cdi = cdi
        self._checkpoint = checkpoint
        self._inventory = inventory
        self._kube_retry = kube_retry
        self._locks = _KeyedLocks()

    @property
    def prepared(self) -> dict[str, PreparedClaim]:
        """The prepared claims by UID (the checkpoint's entries)."""
        return dict(self._checkpoint.claims)

    # NodePrepareResources

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Each claim's devices, or the error the kubelet shows for it."""
        outcomes = await asyncio.gather(*(self._prepare_one(ref) for ref in refs))
        return {ref.uid: outcome for ref, outcome in zip(refs, outcomes, strict=True)}

    async def _prepare_one(self, ref: ClaimRef) -> PreparedClaim | str:
        async with self._locks.hold(ref.uid):
            try:
                known = self._checkpoint.get(ref.uid)
                if known is not None:
                    return await self._ensure(known)
                return await self._prepare_new(ref)
            except ClaimError as exc:
                log.warning("claim not prepared", extra={"claim": str(ref), "reason": str(exc)})
                return str(exc)

    async def _prepare_new(self, ref: ClaimRef) -> PreparedClaim:
        claim = await self._read(ref)
        devices = await self._devices(claim, ref)
        if not devices:
            return PreparedClaim(ref, (), (), "")
        shares = merged_shares(ref, devices)
        prepared = PreparedClaim(ref, devices, shares, self._cdi.device_id(ref.uid))
        try:
            spec = await self._allocate(prepared)
        except ClaimError as exc:
            if isinstance(exc.__cause__, RuntimeUnavailableError):
                # The call may have reached the Runtime before the answer was lost.
                await self._undo(ref)
            raise
        try:
            await asyncio.to_thread(self._record, prepared, spec)
        except (CdiError, CheckpointError) as exc:
            await self._undo(ref)
            raise ClaimError(f"{ref}: {exc}") from exc
        log.info(
            "claim prepared",
            extra={"claim": str(ref), "devices": ",".join(s.device_id for s in shares)},
        )
        return prepared

    async def _devices(self, claim: KubeObject, ref: ClaimRef) -> tuple[ClaimDevice, ...]:
        """The claim's devices, resolved against the known inventory; against the Runtime's
        own when that is unknown or refuses the claim (it may lag behind the Runtime). A
        refusal by the known inventory stands when the Runtime cannot be asked."""
        known = self._inventory() if self._inventory is not None else None
        refused: ClaimError | None = None
        if known is not None:
            try:
                return claim_devices(claim, ref, self.driver, self.pool, known)
            except ClaimError as exc:
                refused = exc
        try:
            inventory = await self._runtime.list_devices()
        except (RuntimeUnavailableError, RuntimeCallError) as exc:
            if refused is not None:
                raise refused from None
            raise ClaimError(f"{ref}: cannot read the Runtime's devices: {exc}") from exc
        return claim_devices(claim, ref, self.driver, self.pool, inventory)

    def _record(self, claim: PreparedClaim, spec: pb.InjectionSpec) -> None:
        """Write the claim's CDI spec, then its checkpoint entry (blocking)."""
        self._cdi.write(claim.ref.uid, spec)
        self._checkpoint.put(claim)

    async def _ensure(self, known: PreparedClaim) -> PreparedClaim:
        """A checkpointed claim again: the Runtime holds it (the same Allocate is answered
        with the existing allocation; one lost is allocated again) and its spec is there."""
        spec = await self._allocate(known)
        if not self._cdi.exists(known.ref.uid):
            try:
                await asyncio.to_thread(self._cdi.write, known.ref.uid, spec)
            except CdiError as exc:
                raise ClaimError(f"{known.ref}: {exc}") from exc
        return known

    async def _read(self, ref: ClaimRef) -> KubeObject:
        try:
            return await call_async(
                f"GET {ref}", lambda: read_claim(self._kube, ref), self._kube_retry
            )
        except KubeError as exc:
            raise ClaimError(f"{ref}: cannot read it from the API server: {exc}") from exc

    async def _allocate(self, claim: PreparedClaim) -> pb.InjectionSpec:
        ref = claim.ref
        request = pb.AllocateRequest(
            container_key=container_key(ref.uid),
            pod_namespace=ref.namespace,
            devices=[to_request(s) for s in claim.shares],
            claim_uid=ref.uid,
            claim_name=ref.name,
        )
        try:
            response = await self._runtime.allocate(request)
        except (RuntimeCallError, RuntimeUnavailableError) as exc:
            raise ClaimError(f"{ref}: {exc}") from exc
        return response.spec

    async def _undo(self, ref: ClaimRef) -> None:
        """Best effort after a failed prepare: nothing held, no spec."""
        with contextlib.suppress(RuntimeUnavailableError, RuntimeCallError):
            await self._runtime.release(container_key(ref.uid))
        with contextlib.suppress(CdiError):
            self._cdi.remove(ref.uid)

    # NodeUnprepareResources

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim "" once nothing is held for it any more (an unknown claim too), else the
        error."""
        outcomes = await asyncio.gather(*(self._unprepare_one(ref) for ref in refs))
        return {ref.uid: outcome for ref, outcome in zip(refs, outcomes, strict=True)}

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        async with self._locks.hold(ref.uid):
            try:
                released = await self._runtime.release(container_key(ref.uid))
                await asyncio.to_thread(self._forget, ref.uid)
            except (RuntimeUnavailableError, RuntimeCallError, CdiError, CheckpointError) as exc:
                log.warning("claim not unprepared", extra={"claim": str(ref), "reason": str(exc)})
                return f"{ref}: {exc}"
        log.info("claim unprepared", extra={"claim": str(ref), "released": released})
        return ""

    def _forget(self, uid: str) -> None:
        """Remove the claim's CDI spec, then its checkpoint entry (blocking)."""
        self._cdi.remove(uid)
        self._checkpoint.drop(uid)

    # Start, and the Runtime back

    async def reconcile(self) -> Reconciled:
        """Load the checkpoint and make the Runtime agree with it: allocate again what the
        Runtime lost, release claim allocations that neither the checkpoint nor the API
        server knows (claim gone, or another UID), remove CDI specs of unknown claims.
        Raises CheckpointError, RuntimeUnavailableError and RuntimeCallError."""
        await asyncio.to_thread(self._checkpoint.load)
        known = self._checkpoint.claims
        held = await self._held()
        reallocated = await self._hold(known, held, lost_only=False)
        released = [
            uid
            for uid, allocation in held.items()
            if uid not in known and await self._orphan(allocation)
        ]
        for uid in released:
            await self._runtime.release(container_key(uid))
            log.warning("claim allocation released (no such claim)", extra={"claim": uid})
        removed = sorted(self._cdi.claim_uids() - set(known))
        for uid in removed:
            self._cdi.remove(uid)
        return Reconciled(tuple(reallocated), tuple(released), tuple(removed))

    async def restore_lost(self) -> None:
        """After the Runtime came back (it may have restarted without its allocations):
        allocate again the prepared claims it does not hold, from the checkpoint as it
        stands (not read again), each under its claim's lock, so no prepare or unprepare
        runs beside it. Raises RuntimeUnavailableError and RuntimeCallError when the
        Runtime's allocations cannot be listed."""
        known = self._checkpoint.claims  # before the listing: a claim prepared later is held
        restored = await self._hold(known, await self._held(), lost_only=True)
        log.info(
            "prepared claims checked after the Runtime came back",
            extra={"prepared": len(known), "reallocated": len(restored)},
        )

    async def _held(self) -> dict[str, pb.Allocation]:
        """The Runtime's claim allocations by claim UID."""
        return {a.claim_uid: a for a in await self._runtime.list_allocations() if a.claim_uid}

    async def _hold(
        self,
        claims: Mapping[str, PreparedClaim],
        held: Mapping[str, pb.Allocation],
        *,
        lost_only: bool,
    ) -> list[str]:
        """Allocate the checkpointed claims (those the Runtime lost, or all: the Runtime
        answers a held one with its allocation) and write their missing CDI specs; the UIDs
        the Runtime had lost."""
        reallocated: list[str] = []
        for uid in claims:
            if lost_only and uid in held:
                continue
            async with self._locks.hold(uid):
                claim = self._checkpoint.get(uid)
                if claim is None:  # unprepared meanwhile
                    continue
                try:
                    await self._ensure(claim)
                except ClaimError as exc:
                    log.error("checkpointed claim not held", extra={"reason": str(exc)})
                    continue
            if uid not in held:
                reallocated.append(uid)
                log.warning("claim allocated again (the Runtime lost it)", extra={"claim": uid})
        return reallocated

    async def _orphan(self, allocation: pb.Allocation) -> bool:
        """True when the API server has no claim of this allocation's name and UID."""
        ref = ClaimRef(allocation.pod_namespace, allocation.claim_name, allocation.claim_uid)
        try:
            await self._read(ref)
        except ClaimError as exc:
            cause = exc.__cause__
            if isinstance(cause, KubeError) and not isinstance(cause, NotFoundError):
                log.warning("claim allocation kept", extra={"claim": str(ref), "reason": str(exc)})
                return False
            return True
        return False
