"""Shared machinery of step activities: an attempt's rank and fenced writes, and the watch that keeps a long attempt alive.

An activity attempt writes with the rank Temporal gave it when it was scheduled: the workflow's step number (in the
activity's input) and `activity.info().attempt` (`AttemptWriter`). Each of its writes is one value built here (a
`StateChange`, or the attempt's `FencedWrite` with what it writes: crewwork/store/fencing/vocabulary.py) and handed to
the store unchanged. The store accepts its writes only while no write of a later-scheduled attempt has been accepted,
so an attempt that wakes late is refused at its first write and stops there (`StaleAttempt`), before it runs an agent
or a test.

A long attempt (an agent run, a validation) runs inside `watch`: a background task heartbeats to Temporal and asks
the store every few seconds whether a later attempt has written; if so, or if the item has ended, it cancels the
attempt's own work (self-fencing). Any write it still tries is rejected by the store anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crewwork.models import WorkItemState
from crewwork.steps.errors import STALE_ATTEMPT, bad_input
from crewwork.store.fencing import AttemptRecord, FencedWrite, HandedOff, Rank, StateChange, WriteResult
from crewwork.store.leases import WORKSPACE_PREFIX
from crewwork.store.store import Store
from crewwork.store.views import NewArtifact

log = logging.getLogger("crewwork.steps")


class Stepped(Protocol):
    work_item_id: str
    tenant_id: str
    step: int


@dataclass(frozen=True)
class AttemptWriter:
    """The writes of one activity attempt, all at its scheduling rank."""

    store: Store
    work_item_id: str
    tenant_id: str
    rank: Rank
    writer: str
    """Who wrote, for events: `<activity>#<attempt>`."""
    write: FencedWrite = field(init=False)
    """What every write of this attempt presents (built once, here)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "write", FencedWrite(self.work_item_id, self.tenant_id, self.rank, self.writer))

    @classmethod
    def of(cls, store: Store, inp: Stepped) -> AttemptWriter:
        """The writer of the running activity attempt for `inp` (which carries the workflow's step number)."""
        try:
            info = activity.info()
            attempt, name = info.attempt, info.activity_type
        except RuntimeError:  # called outside an activity (tools, tests): attempt 1 of the step
            attempt, name = 1, "direct"
        return cls(store, inp.work_item_id, inp.tenant_id, Rank(inp.step, attempt), f"{name}#{attempt}")

    async def set_state(
        self,
        state: WorkItemState,
        reason: str,
        *,
        fields: dict[str, Any] | None = None,
        event_data: dict[str, Any] | None = None,
        max_in_flight: int | None = None,
        hand_off_cap: int = 0,
        attempt: AttemptRecord | None = None,
    ) -> WriteResult[list[HandedOff]]:
        """A fenced state change at this attempt's rank, built here once (`StateChange`: with `max_in_flight`, a
        change that frees the item's place hands it to the tenant's first queued items)."""
        return await self.store.set_state(
            StateChange(
                self.write,
                state,
                reason,
                fields=fields,
                event_data=event_data,
                max_in_flight=max_in_flight,
                hand_off_cap=hand_off_cap,
                attempt=attempt,
            )
        )

    async def event(self, type_: str, data: dict[str, Any], artifacts: Sequence[NewArtifact] = ()) -> WriteResult[None]:
        return await self.store.fenced_event(self.write, type_, data, artifacts)

    async def record_attempt(self, record: AttemptRecord) -> WriteResult[list[str | None]]:
        """This attempt's record (`FencingStore.record_attempt`): the item's failure fingerprints when accepted."""
        return await self.store.record_attempt(self.write, record)

    async def superseded(self) -> str | None:
        """Why this attempt may no longer write (a later-scheduled attempt has, or the item ended), or None."""
        found = await self.store.current_rank(self.work_item_id)
        if found is None:
            return f"work item {self.work_item_id} is not in the store"
        current, state = found
        if current > self.rank:
            return f"a later attempt ({current}) has written; this one ({self.rank}) is stale"
        if WorkItemState(state).terminal:
            return f"the work item is already {state}"
        return None

    def stale(self, result: WriteResult[Any], what: str) -> ApplicationError:
        """The error that ends an attempt whose write was refused: never retried, since Temporal has already
        scheduled something newer (or the item ended) and ignores this attempt's outcome either way."""
        if result.missing:
            return bad_input(f"work item {self.work_item_id} is not in the store")
        why = f"the work item is already {result.state}" if result.closed else f"the current rank is {result.current}"
        return ApplicationError(f"{what}: {self.writer} at {self.rank} was refused: {why}", type=STALE_ATTEMPT)


@dataclass
class Watch:
    """A long attempt's liveness: heartbeats to Temporal and the self-fencing probe."""

    writer: AttemptWriter
    details: list[Any] = field(default_factory=list)
    superseded_because: str | None = None
    partitioned: bool = False
    """Test-only fault injection: this attempt has stopped heartbeating and probing (a zombie cut off from Temporal
    and the store's answers), but it still runs and still tries its writes, which the store must then reject."""

    def simulate_partition(self) -> None:
        self.partitioned = True

    def heartbeat(self, *details: Any) -> None:
        if details:
            self.details = list(details)
        if self.partitioned:
            return
        with contextlib.suppress(RuntimeError):
            activity.heartbeat(*self.details)

    async def ensure_current(self) -> None:
        """Raise `StaleAttempt` if a later attempt has written (call before an external call that costs money)."""
        why = await self.writer.superseded()
        if why is not None:
            raise ApplicationError(f"{self.writer.writer} stopped before its next call: {why}", type=STALE_ATTEMPT)


@contextlib.asynccontextmanager
async def watch(
    writer: AttemptWriter, *, every_s: float = 2.0, workspace_ttl_s: float | None = None
) -> AsyncIterator[Watch]:
    """Keep a long attempt alive and fenced while the body runs. With `workspace_ttl_s`, each round also extends the
    workspace leases the work item holds, so a long run cannot let another item take its branch."""
    w = Watch(writer)
    work = asyncio.current_task()

    async def rounds() -> None:
        while True:
            await asyncio.sleep(every_s)
            if w.partitioned:
                # The simulated zombie hears nothing from Temporal or the store, so it cannot be cancelled; but
                # once its item has ended nothing it does can matter, and the platform takes its slot back.
                with contextlib.suppress(Exception):
                    found = await writer.store.current_rank(writer.work_item_id)
                    if found is not None and WorkItemState(found[1]).terminal:
                        w.superseded_because = f"the work item is already {found[1]}"
                        log.warning(
                            "%s of %s (a zombie) is stopped: its item ended", writer.writer, writer.work_item_id
                        )
                        if work is not None:
                            work.cancel("item ended")
                        return
                continue
            w.heartbeat()
            try:
                why = await writer.superseded()
                if why is None and workspace_ttl_s:
                    await writer.store.renew_leases_held_by(writer.work_item_id, WORKSPACE_PREFIX, workspace_ttl_s)
            except Exception as exc:  # a database blip must not kill the work; the next round retries
                log.warning("liveness round failed for %s: %s", writer.writer, exc)
                continue
            if why is not None:
                w.superseded_because = why
                log.warning("%s of %s stops itself: %s", writer.writer, writer.work_item_id, why)
                if work is not None:
                    work.cancel("superseded")
                return

    keeper = asyncio.create_task(rounds())
    try:
        yield w
    except asyncio.CancelledError:
        if w.superseded_because is not None:
            raise ApplicationError(
                f"{writer.writer} of {writer.work_item_id} stopped itself: {w.superseded_because}", type=STALE_ATTEMPT
            ) from None
        raise
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await keeper


async def artifact_bytes(store: Store, artifact_id: str) -> bytes:
    """An artifact's content, for a step that consumes an earlier step's output (the diff); missing is bad input."""
    data = await store.artifact_content(artifact_id)
    if data is None:
        raise bad_input(f"artifact {artifact_id} is missing")
    return data
