"""An attempt's fenced writer and its watch (crewwork/steps/attempt.py) against the real store."""

from __future__ import annotations

import asyncio

import pytest

from crewwork.models import WorkItemState
from crewwork.steps.attempt import AttemptWriter, watch
from crewwork.store.store import Rank, Store
from tests.steps.items import new_item, set_state_at


async def test_a_watched_attempt_stops_itself_when_a_later_attempt_writes(any_store: Store) -> None:
    from temporalio.exceptions import ApplicationError

    tid, wid = await new_item(any_store)
    me = AttemptWriter(any_store, wid, tid, Rank(2, 1), "run_agent#1")
    assert (await me.set_state(WorkItemState.running, "mine")).ok
    with pytest.raises(ApplicationError) as err:
        async with watch(me, every_s=0.05):
            await set_state_at(any_store, wid, Rank(2, 2), WorkItemState.running, "run_agent#2")
            await asyncio.sleep(5)  # the work: cancelled by the watch long before this ends
    assert err.value.type == "StaleAttempt" and "stale" in str(err.value)
    assert await me.superseded() is not None
