"""The event horizon tails the events table only while a stream holds it: an idle API process makes no event
queries, and the first stream after an idle spell starts from a fresh safe id (never from the stale one), on both
databases."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from crewwork.api.streams import EventHorizon
from crewwork.models import WorkItemSpec
from crewwork.store.store import Store


class CountingStore:
    """The real store, with its horizon queries counted (every call still goes to the database)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def event_ids_after(self, after_id: int, limit: int) -> list[int]:
        self.calls += 1
        return await self.store.event_ids_after(after_id, limit)


async def _item(store: Store) -> tuple[str, str]:
    tid = await store.ensure_tenant(f"horizon-{uuid.uuid4().hex[:8]}")
    row = (
        await store.create_work_item(
            tenant_id=tid,
            spec=WorkItemSpec.model_validate({"kind": "task", "input": {}}),
            base_commit=None,
            repo_path=None,
        )
    )[0]
    return row.id, tid


async def test_an_idle_horizon_makes_no_queries_and_a_new_stream_starts_from_a_fresh_safe_id(any_store: Store) -> None:
    wid, tid = await _item(any_store)
    counting = CountingStore(any_store)
    horizon = EventHorizon(counting, poll_s=0.01)  # type: ignore[arg-type]
    await horizon.start()
    try:
        await asyncio.sleep(0.3)  # 30 poll intervals with no stream
        assert counting.calls == 0
        assert not horizon.ready.is_set()

        async with horizon.subscribed():
            assert horizon.ready.is_set()
            first = horizon.safe
            await any_store.append_event(wid, tid, "probe", {})
            assert await horizon.wait_advance(10)
            while horizon.safe == first:  # an advance may be the first step's, before the probe is seen
                assert await horizon.wait_advance(10)
            seen = horizon.safe
            assert seen > first and counting.calls > 0

        # Idle again: events written meanwhile are not tailed...
        await asyncio.sleep(0.1)
        calls = counting.calls
        for _ in range(3):
            await any_store.append_event(wid, tid, "while-idle", {})
        await asyncio.sleep(0.3)
        assert counting.calls == calls and horizon.safe == seen

        # ...and the next stream does not start from the stale id: the safe id is found again, past all of them.
        async with horizon.subscribed():
            newest = await any_store.max_event_id()
            assert horizon.safe == newest > seen
    finally:
        await horizon.stop()


async def test_two_streams_share_the_horizon_and_it_stops_only_when_both_are_gone(any_store: Store) -> None:
    wid, tid = await _item(any_store)
    counting = CountingStore(any_store)
    horizon = EventHorizon(counting, poll_s=0.01)  # type: ignore[arg-type]
    await horizon.start()
    try:
        a = horizon.subscribed()
        await a.__aenter__()
        async with horizon.subscribed():
            pass  # the second stream leaves first: the first one still holds the horizon
        await any_store.append_event(wid, tid, "probe", {})
        before = horizon.safe
        deadline = asyncio.get_running_loop().time() + 10
        while horizon.safe == before:
            assert asyncio.get_running_loop().time() < deadline, "the horizon stopped with a stream still open"
            await horizon.wait_advance(1)
        await a.__aexit__(None, None, None)
        await asyncio.sleep(0.1)
        calls = counting.calls
        await asyncio.sleep(0.3)
        assert counting.calls == calls
    finally:
        await horizon.stop()
