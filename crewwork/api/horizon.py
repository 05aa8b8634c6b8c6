"""The safe event id for live streams (crewwork/api/streams.py), which resume exactly after the last event a client
saw.

Exactness needs care on PostgreSQL: ids come from a sequence when a row is inserted, but transactions commit in
any order, so a reader that has seen id 12 may later see id 11 appear. A reader that simply remembered "after 12"
would lose 11. `EventHorizon` therefore tracks a *safe* id: the largest id such that every smaller id is either
visible or will never appear. It tails the (global) id sequence; at a gap it waits until every transaction that was
open in this database when the gap was seen has ended (then the missing id was rolled back and is gone for good).
Streams only ever emit rows with `id <= safe`. On SQLite, writers are serialized, so the newest id is always safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from crewwork.store.store import Store

log = logging.getLogger("crewwork.api.streams")

GAP_MIN_WAIT_S = 0.2
"""A gap is never skipped sooner (covers the instant between taking an id and the transaction getting an xid)."""
GAP_MAX_WAIT_S = 10.0
"""A gap is skipped after this long even if an old transaction is still open (bounded staleness)."""


class EventHorizon:
    def __init__(self, store: Store, poll_s: float = 0.2) -> None:
        self.store = store
        self.poll_s = poll_s
        self.safe = 0
        self.ready = asyncio.Event()
        self._advanced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._gap: tuple[int, float, set[tuple[int, str]]] | None = None
        self._subscribers = 0
        self._wanted = asyncio.Event()
        self.closing = asyncio.Event()
        """Set when the process shuts down: every stream ends with a resumable close."""

    def close(self) -> None:
        """End every open stream (the process is shutting down); new ones end at once too."""
        self.closing.set()
        self._notify()

    @contextlib.asynccontextmanager
    async def subscribed(self) -> AsyncIterator[None]:
        """Hold the horizon live for one stream. It tails the events table only while a stream is open: with none,
        it makes no query at all (an API process would otherwise poll the events table several times a second
        forever), and the first stream after an idle spell waits for a fresh safe id, found as at startup."""
        self._subscribers += 1
        self._wanted.set()
        try:
            waits = [asyncio.ensure_future(self.ready.wait()), asyncio.ensure_future(self.closing.wait())]
            try:
                done, _ = await asyncio.wait(waits, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if not done:
                raise TimeoutError("the event horizon did not become ready in 30 s")
            yield
        finally:
            self._subscribers -= 1

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_advance(self, within_s: float) -> bool:
        """Until the safe id moves or the horizon closes (True), or `within_s` passes (False)."""
        ev = self._advanced
        try:
            await asyncio.wait_for(ev.wait(), within_s)
            return True
        except TimeoutError:
            return False

    def _notify(self) -> None:
        ev, self._advanced = self._advanced, asyncio.Event()
        ev.set()

    async def _initial(self) -> int:
        top = await self.store.max_event_id()
        if self.store.is_sqlite:
            return top
        # Rows below `top` may still be in flight: wait for the transactions open now to end.
        before = await self.store.open_transaction_ids()
        deadline = time.monotonic() + GAP_MAX_WAIT_S
        while before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            before &= await self.store.open_transaction_ids()
        return top

    async def _step(self) -> bool:
        ids = await self.store.event_ids_after(self.safe, 2000)
        if not ids:
            return False
        if self.store.is_sqlite:
            self.safe = ids[-1]
            return True
        new_safe = self.safe
        for i in ids:
            if i == new_safe + 1:
                new_safe = i
                continue
            # A gap at new_safe + 1: skip it only once it cannot be filled any more.
            now = time.monotonic()
            if self._gap is None or self._gap[0] != new_safe + 1:
                self._gap = (new_safe + 1, now, await self.store.open_transaction_ids())
                break
            gap_id, seen, open_then = self._gap
            elapsed = now - seen
            if elapsed < GAP_MIN_WAIT_S:
                break
            still_open = open_then & await self.store.open_transaction_ids() if open_then else set()
            if still_open and elapsed < GAP_MAX_WAIT_S:
                self._gap = (gap_id, seen, still_open)
                break
            self._gap = None
            new_safe = i
        moved = new_safe != self.safe
        self.safe = new_safe
        return moved

    async def _run(self) -> None:
        while True:
            try:
                if not self._subscribers:
                    # Nothing reads the horizon: drop it and sleep until a stream subscribes. No await between
                    # the check and the wait, so a subscription cannot slip in unseen.
                    self.ready.clear()
                    self._wanted.clear()
                    self._gap = None
                    await self._wanted.wait()
                    continue
                if not self.ready.is_set():
                    self.safe = await self._initial()
                    self.ready.set()
                    self._notify()
                while await self._step():
                    self._notify()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # database briefly unavailable: keep the last safe id, retry
                log.warning("event horizon: %s", exc)
            await asyncio.sleep(self.poll_s)
