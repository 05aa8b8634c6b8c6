"""Shared machinery of activities: the execution lease kept alive by heartbeats, and error translation.

Each activity attempt that writes takes a fresh fencing token at its start by superseding the work item's
execution lease: a new Temporal attempt replaces the old one at once, even while the old one still runs. A
background task heartbeats to Temporal and renews the lease with the token; when renewal finds the lease gone
(a newer attempt took it), the activity cancels its own work (self-fencing), and any write it still tries is
rejected by the store anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crewwork.models import WorkItemState
from crewwork.store.store import Store, WriteResult, mask_secrets, work_item_fence_key

log = logging.getLogger("crewwork.activities")

# Error types the workflow's retry policies name as non-retryable.
BAD_INPUT = "BadInput"
AGENT_ERROR = "AgentError"
LANDING_CONFLICT = "LandingConflict"
LEASE_LOST = "LeaseLost"
NON_RETRYABLE_TYPES = [BAD_INPUT, AGENT_ERROR, "AgentConfigError", LANDING_CONFLICT]


def bad_input(message: str) -> ApplicationError:
    return ApplicationError(message, type=BAD_INPUT, non_retryable=True)


@dataclass
class ExecutionLease:
    store: Store
    work_item_id: str
    ttl_s: float
    heartbeat_every_s: float = 2.0
    token: int = 0
    lost: bool = False
    partitioned: bool = False
    """Test-only fault injection: this attempt has stopped heartbeating and renewing (a zombie cut off from
    Temporal), but it still runs and still tries its writes, which the store must then reject."""
    details: list[Any] = field(default_factory=list)
    started: WriteResult[None] | None = None
    """The attempt's first write, made in the transaction that took the lease (see `execution_lease(first=...)`)."""
    released: bool = False
    """The lease was released together with the attempt's last write (`record_step(..., release=True)`)."""

    def holder(self) -> str:
        try:
            info = activity.info()
            return f"{info.activity_type}/{info.workflow_id}/{info.activity_id}#{info.attempt}"
        except RuntimeError:
            return "outside-activity"

    def simulate_partition(self) -> None:
        """Fault injection (tests only): stop all liveness of this attempt for the rest of its life."""
        self.partitioned = True

    def heartbeat(self, *details: Any) -> None:
        if details:
            self.details = list(details)
        if self.partitioned:
            return
        with contextlib.suppress(RuntimeError):
            activity.heartbeat(*self.details)


async def record_step(
    lease: ExecutionLease, tenant_id: str, type_: str, data: dict[str, Any], writer: str, *, release: bool = False
) -> WriteResult[None]:
    """A fenced event with the attempt's own lease token: what this attempt produced (its evidence refs).

    The event log then names the accepted attempt's artifacts; a superseded attempt's write is rejected and
    recorded as `stale_write_rejected`, so its artifacts stay unreferenced. With `release`, an accepted write also
    releases the execution lease in its transaction (the attempt's last write: one transaction fewer)."""

    async def _apply(s: Any, now: float, token: int) -> None:
        await lease.store.insert_event(
            s,
            work_item_id=lease.work_item_id,
            tenant_id=tenant_id,
            type=type_,
            data=mask_secrets(data),
            token=token,
            created_at=now,
        )

    res = await lease.store.fenced_write(
        token=lease.token,
        work_item_id=lease.work_item_id,
        tenant_id=tenant_id,
        writer=writer,
        apply=_apply,
        release_lease=release,
    )
    if release and res.ok:
        lease.released = True
    return res


@dataclass(frozen=True)
class FirstWrite:
    """An execution attempt's first state, written in the transaction that issues its token and takes the lease."""

    tenant_id: str
    state: WorkItemState
    reason: str
    writer: str
    event_data: dict[str, Any]


@contextlib.asynccontextmanager
async def execution_lease(
    store: Store,
    work_item_id: str,
    ttl_s: float,
    heartbeat_every_s: float = 2.0,
    workspace_ttl_s: float | None = None,
    first: FirstWrite | None = None,
) -> AsyncIterator[ExecutionLease]:
    """Supersede the work item's execution lease for this attempt and keep it alive while the body runs.

    With `workspace_ttl_s`, the renewals also keep the item's workspace leases (held by the work item id) alive, so
    a long agent run or validation cannot let another item take the branch from under it. With `first`, the
    attempt's first state and the lease are one transaction (`Store.set_state(token=None, lease=...)`); its result
    is `lease.started` (stale when the item is already terminal). An item not in the store is BadInput."""
    lease = ExecutionLease(store, work_item_id, ttl_s, heartbeat_every_s)
    key = work_item_fence_key(work_item_id)
    token: int | None
    if first is not None:
        lease.started = await store.set_state(
            work_item_id=work_item_id,
            tenant_id=first.tenant_id,
            token=None,
            state=first.state,
            reason=first.reason,
            writer=first.writer,
            event_data=first.event_data,
            lease=(lease.holder(), ttl_s),
        )
        if lease.started.missing:
            raise bad_input(f"work item {work_item_id} is not in the store")
        token = lease.started.token
    else:
        token, _ = await store.acquire_lease(key, lease.holder(), ttl_s, supersede=True)
    assert token is not None
    lease.token = token
    work = asyncio.current_task()

    async def keep_alive() -> None:
        while True:
            await asyncio.sleep(heartbeat_every_s)
            if lease.partitioned or lease.released:
                return
            lease.heartbeat()
            try:
                renewed = await store.renew_lease(key, token, ttl_s)
                if renewed and workspace_ttl_s:
                    await store.renew_leases_held_by(work_item_id, "ws:", workspace_ttl_s)
            except Exception as exc:  # a database blip must not kill the work; the next renewal retries
                log.warning("lease renewal failed for %s: %s", key, exc)
                continue
            if not renewed and not lease.released:
                lease.lost = True
                log.warning("lease %s token %s superseded: stopping this attempt's work", key, token)
                if work is not None:
                    work.cancel("lease lost")
                return

    keeper = asyncio.create_task(keep_alive())
    try:
        yield lease
    except asyncio.CancelledError:
        if lease.lost:
            raise ApplicationError(
                f"execution lease of {work_item_id} was superseded (token {token}); this attempt stopped itself",
                type=LEASE_LOST,
            ) from None
        raise
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await keeper
        if not lease.released:
            await _release_with_retries(store, key, token)


RELEASE_RETRY_DELAYS_S = (0.2, 0.5, 1.0)


async def _release_with_retries(store: Store, key: str, token: int) -> None:
    """Release the execution lease, retrying a few times over a database blip; if it still fails, the lease
    simply expires after its TTL (releasing is an optimisation, never needed for correctness)."""
    for delay in (*RELEASE_RETRY_DELAYS_S, None):
        try:
            await asyncio.shield(store.release_lease(key, token=token))
            return
        except Exception as exc:
            if delay is None:
                log.warning("could not release lease %s token %s (it expires on its own): %s", key, token, exc)
                return
            await asyncio.sleep(delay)
