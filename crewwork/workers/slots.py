"""Agent slots that poll ahead: an agent pool's slot asks Temporal for its next task as soon as its agent returns,
while the attempt still writes its last transaction and reports its completion.

Temporal's fixed slot supplier polls only for a free slot, and a slot is free only once the activity's completion
has been sent: the tail (the attempt's last write, encoding the result, the completion round trip, then the poll
round trip and the server's matching) leaves the slot idle, which matters for short agents (docs/performance.md,
"Figures behind the code"). `PollAheadSlots` counts a slot as taken only while its activity has not reached its tail:
an activity declares its tail with `agent_done()` (or, at the latest, when it returns: `SlotInterceptor`), and from
then on its slot may already be polled for again.

So at most `limit` agents run at once, as with a fixed supplier, and at most `limit` more attempts are finishing their
writes. Nothing waits in the process for a slot: a reservation is only granted when an agent slot is free, so a
task taken by this process starts at once (no prefetch that could leave another process idle). Fencing, events and
at-least-once delivery are untouched: an attempt's writes and their ranks are the same, only the next poll starts
earlier.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

from temporalio.worker import (
    ActivityInboundInterceptor,
    CustomSlotSupplier,
    ExecuteActivityInput,
    FixedSizeSlotSupplier,
    Interceptor,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
    WorkerTuner,
)

_TICKET: contextvars.ContextVar[_Ticket | None] = contextvars.ContextVar("crewwork_slot_ticket", default=None)


class PollAheadSlots(CustomSlotSupplier):
    """Activity slots of which at most `limit` run agents; up to `limit` more may be in their tail."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        """Reserved slots whose activity has not declared its tail (or has not started)."""
        self.total = 0
        """Reserved slots not yet released."""
        self.declared = 0
        """Activities that declared their tail and whose slot is not yet released."""
        self._lock = threading.Lock()  # mark_slot_used/release_slot may come from the SDK's own threads
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def _can_reserve(self) -> bool:
        return self.active < self.limit and self.total < 2 * self.limit

    def _wake(self) -> None:
        # Called with the lock held.
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut)

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._can_reserve():
                    self.active += 1
                    self.total += 1
                    return SlotPermit()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            await fut

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        with self._lock:
            if not self._can_reserve():
                return None
            self.active += 1
            self.total += 1
            return SlotPermit()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        pass

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        with self._lock:
            self.total -= 1
            # A used slot whose activity declared its tail has already given its agent place back. The pairing of
            # declarations and releases is by count: a used slot that never reached the interceptor is released
            # with the place it still holds, and whichever order two releases come in, the counts agree once both
            # are done (in between the supplier only errs towards granting less).
            if ctx.slot_info is not None and self.declared > 0:
                self.declared -= 1
            else:
                self.active -= 1
            self._wake()

    def tail(self) -> None:
        with self._lock:
            self.active -= 1
            self.declared += 1
            self._wake()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Ticket:
    def __init__(self, slots: PollAheadSlots) -> None:
        self.slots = slots
        self.done = False

    def release(self) -> None:
        if not self.done:
            self.done = True
            self.slots.tail()


def agent_done() -> None:
    """The running activity has done its agent's work: what is left is its last writes and its completion, so its
    slot may poll for the next task (a no-op outside a poll-ahead pool)."""
    ticket = _TICKET.get()
    if ticket is not None:
        ticket.release()


class SlotInterceptor(Interceptor):
    """Gives each activity attempt of a poll-ahead pool its ticket; returning declares the tail at the latest."""

    def __init__(self, slots: PollAheadSlots) -> None:
        self.slots = slots

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self.slots)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, slots: PollAheadSlots) -> None:
        super().__init__(next)
        self.slots = slots

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        ticket = _Ticket(self.slots)
        token = _TICKET.set(ticket)
        try:
            return await self.next.execute_activity(input)
        finally:
            _TICKET.reset(token)
            ticket.release()


def poll_ahead_tuner(limit: int) -> tuple[WorkerTuner, PollAheadSlots]:
    """A tuner whose activity slots poll ahead (workflow and local-activity slots unused in an agent pool)."""
    slots = PollAheadSlots(limit)
    fixed = FixedSizeSlotSupplier(1)
    tuner = WorkerTuner.create_composite(
        workflow_supplier=fixed, activity_supplier=slots, local_activity_supplier=fixed, nexus_supplier=fixed
    )
    return tuner, slots
