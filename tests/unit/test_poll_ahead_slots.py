"""The agent pool's poll-ahead slot supplier: never more than `limit` agents at once, a slot polled for again once
its activity reaches its tail, and counts that agree however releases and declarations interleave."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from crewwork.workers.slots import PollAheadSlots, _Ticket

USED = SimpleNamespace(slot_info=SimpleNamespace(activity_type="run_agent"), permit=None)
UNUSED = SimpleNamespace(slot_info=None, permit=None)


async def _blocked(slots: PollAheadSlots) -> asyncio.Task:
    task = asyncio.create_task(slots.reserve_slot(None))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    return task


async def test_reservation_waits_until_an_agent_reaches_its_tail() -> None:
    slots = PollAheadSlots(1)
    await slots.reserve_slot(None)  # type: ignore[arg-type]
    nxt = await _blocked(slots)
    assert not nxt.done(), "a second agent slot was granted while the first agent runs"
    ticket = _Ticket(slots)
    ticket.release()  # the first activity's agent returned: its last write and completion are left
    await asyncio.wait_for(nxt, 1)
    assert (slots.active, slots.total) == (1, 2)
    ticket.release()  # declaring twice (agent_done, then the interceptor) counts once
    assert slots.active == 1
    third = await _blocked(slots)
    assert not third.done(), "a third slot: more than one agent would run at once"
    slots.release_slot(USED)  # the first completion is sent
    await asyncio.sleep(0.01)
    assert not third.done() and (slots.active, slots.total, slots.declared) == (1, 1, 0)
    third.cancel()


async def test_never_more_than_twice_the_limit_reserved() -> None:
    slots = PollAheadSlots(2)
    for _ in range(2):
        await slots.reserve_slot(None)  # type: ignore[arg-type]
    _Ticket(slots).release()
    _Ticket(slots).release()
    for _ in range(2):
        await slots.reserve_slot(None)  # type: ignore[arg-type]
    _Ticket(slots).release()
    _Ticket(slots).release()
    assert slots.active == 0 and slots.total == 4
    assert slots.try_reserve_slot(None) is None  # type: ignore[arg-type]


async def test_counts_agree_when_a_used_slot_never_declared() -> None:
    """A used slot that never reached the interceptor (declared nothing) and one that did: the supplier cannot tell
    their releases apart, and both places come back, none twice."""
    slots = PollAheadSlots(2)
    await slots.reserve_slot(None)  # type: ignore[arg-type]
    await slots.reserve_slot(None)  # type: ignore[arg-type]
    _Ticket(slots).release()  # only the first activity declares its tail
    slots.release_slot(USED)
    slots.release_slot(USED)
    assert (slots.active, slots.total, slots.declared) == (0, 0, 0)
    await slots.reserve_slot(None)  # type: ignore[arg-type]
    slots.release_slot(UNUSED)  # a reservation the poll never used
    assert (slots.active, slots.total, slots.declared) == (0, 0, 0)
