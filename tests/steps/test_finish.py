"""The finish step's activity against the real store: a result and its attempt record are one write at one rank (as
are the awaiting-review state and the passing attempt's record), and an ending item hands its place to the first
queued item in its own write (never more than the limit in flight)."""

from __future__ import annotations

import asyncio
from typing import Any

from crewwork.config import Settings
from crewwork.models import WorkItemResult, WorkItemSpec, WorkItemState
from crewwork.steps.admit import AdmitInput
from crewwork.steps.finish import FinishInput
from crewwork.steps.ports import Ports
from crewwork.steps.registry import bound
from crewwork.steps.state import SetStateInput
from crewwork.store.store import Rank, Store
from tests.steps.items import TASK, finish_task, new_item


async def test_a_result_and_its_attempt_record_are_one_write_at_one_rank(any_store: Store, tmp_path: Any) -> None:
    tid, wid = await new_item(any_store)
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path)))
    from crewwork.steps.record import RecordInput

    record = RecordInput(work_item_id=wid, tenant_id=tid, step=6, attempt=1, verdict="passed", reason="output")
    result = WorkItemResult(work_item_id=wid, state=WorkItemState.succeeded, reason="task completed")
    out = await control.finish(FinishInput(work_item_id=wid, tenant_id=tid, step=6, result=result, record=record))
    assert out.ok
    (attempt,) = await any_store.list_attempts(wid)
    row = await any_store.get_work_item(wid)
    assert row is not None and attempt.rank == row.result_rank == row.fence_rank == Rank(6, 1).encode()
    assert (attempt.verdict, row.state, row.attempt_count) == ("passed", "succeeded", 1)
    # A retried finish of the same step finds the item closed and reports success without writing again.
    again = await control.finish(FinishInput(work_item_id=wid, tenant_id=tid, step=6, result=result, record=record))
    assert again.ok and len(await any_store.list_attempts(wid)) == 1


async def test_an_ending_item_hands_its_place_to_the_first_queued_item_in_its_own_write(
    any_store: Store, tmp_path: Any
) -> None:
    """The place goes to the oldest queued item in the ending item's transaction, at the queued item's own mark: it
    needs no second admission, and the queue stays first come, first served."""
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [await new_item(any_store, tenant="handoff") for _ in range(3)]
    got = [await control.admit(AdmitInput(work_item_id=w, tenant_id=t, step=1, spec=spec)) for t, w in items]
    assert [g.admitted for g in got] == [True, False, False]
    assert all(g.budget is not None for g in got), "a queued item learns the terms it will run under"
    marks = {w: (await any_store.get_work_item(w)).fence_rank for _t, w in items}  # type: ignore[union-attr]

    assert (await finish_task(control, items[0], 2)).ok
    states = [(await any_store.get_work_item(w)).state for _t, w in items]  # type: ignore[union-attr]
    assert states == ["succeeded", "admitted", "queued"], "one place, to the first in line"
    second = items[1][1]
    handed = [e for e in await any_store.list_events(second) if e.data.get("state") == "admitted"]
    assert len(handed) == 1 and handed[0].rank == marks[second]
    assert handed[0].data["writer"].startswith(f"hand_off from {items[0][1]}")
    assert (await any_store.get_work_item(second)).fence_rank == marks[second]  # type: ignore[union-attr]
    # Its own admission, when it asks again (a lost signal), finds it admitted and changes nothing.
    again = await control.admit(AdmitInput(work_item_id=second, tenant_id=items[1][0], step=2, spec=spec))
    assert again.admitted
    assert len([e for e in await any_store.list_events(second) if e.type == "state_changed"]) == 2

    # An item that ends while queued holds no place and hands nothing on; awaiting review frees one.
    await control.set_state(
        SetStateInput(work_item_id=second, tenant_id=items[1][0], step=3, state=WorkItemState.awaiting_review)
    )
    assert (await any_store.get_work_item(items[2][1])).state == "admitted"  # type: ignore[union-attr]


async def test_a_write_that_keeps_its_place_or_had_none_hands_nothing_on(any_store: Store, tmp_path: Any) -> None:
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [await new_item(any_store, tenant="keeps") for _ in range(3)]
    for t, w in items:
        await control.admit(AdmitInput(work_item_id=w, tenant_id=t, step=1, spec=spec))
    # running -> validating: still in flight.
    await control.set_state(
        SetStateInput(work_item_id=items[0][1], tenant_id=items[0][0], step=2, state=WorkItemState.validating)
    )
    # A queued item cancelled: it held no place.
    await finish_task(control, items[2], 2)
    assert [(await any_store.get_work_item(w)).state for _t, w in items] == [  # type: ignore[union-attr]
        "validating",
        "queued",
        "succeeded",
    ]
    # A stale finish of the admitted item is refused, and refused writes hand nothing on either.
    await control.set_state(
        SetStateInput(work_item_id=items[0][1], tenant_id=items[0][0], step=5, state=WorkItemState.running)
    )
    stale = await finish_task(control, items[0], 4)
    assert not stale.ok
    assert (await any_store.get_work_item(items[1][1])).state == "queued"  # type: ignore[union-attr]


async def test_items_ending_and_admitting_at_once_never_exceed_the_limit_nor_deadlock(
    pg_url: str, tmp_path: Any
) -> None:
    """On PostgreSQL, with real concurrency: the admitted items of one tenant end at once (each handing its place
    on) while the queued ones ask for admission again. No transaction deadlocks (two ending items each hold the key
    share lock of their event's foreign key on the tenant row when they lock it), the tenant never has more than its
    limit in flight, and the queue drains oldest first."""
    limit = 4
    store = Store(pg_url, pool_size=30)
    try:
        control = bound(Ports.build(store, Settings(data_dir=tmp_path, tenant_max_in_flight=limit)))
        spec = WorkItemSpec.model_validate(TASK)
        items = [await new_item(store, tenant="race") for _ in range(40)]
        tid = items[0][0]
        steps = dict.fromkeys((w for _t, w in items), 1)
        order: list[str] = []

        async def admit(wid: str) -> None:
            steps[wid] += 1
            await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=steps[wid], spec=spec))

        async def finish(wid: str) -> None:
            steps[wid] += 1
            assert (await finish_task(control, (tid, wid), steps[wid])).ok

        for _t, w in items:  # in submission order: the queue is first come, first served among items that asked
            await admit(w)
        peak = 0
        for _round in range(60):
            rows = await store.list_work_items(tid, limit=100)
            flying = [r.id for r in rows if r.state in ("admitted", "running", "validating", "landing")]
            waiting = [r.id for r in rows if r.state == "queued"]
            peak = max(peak, len(flying))
            if not flying and not waiting:
                break
            # No lost wakeup: once every write of the round has committed, no place is free while an item waits.
            assert not waiting or len(flying) == limit, f"{len(flying)} in flight with {len(waiting)} queued"
            order.extend(sorted(flying, key=lambda w: [x[1] for x in items].index(w)))
            await asyncio.wait_for(
                asyncio.gather(*(finish(w) for w in flying), *(admit(w) for w in waiting)), timeout=60
            )
        assert 0 < peak <= limit
        rows = [await store.get_work_item(w) for _t, w in items]
        assert all(r is not None and r.state == "succeeded" for r in rows)
        idx = [x[1] for x in items]
        assert order == idx, f"admitted oldest first: {[idx.index(w) for w in order]}"
    finally:
        await store.close()


async def test_awaiting_review_records_the_passing_attempt_in_its_own_write(any_store: Store, tmp_path: Any) -> None:
    """The passing attempt's record travels with the `awaiting_review` state change (patch `lean-end`): one write at
    the state change's rank, the attempt count raised with it; a write a later step outranks records neither."""
    from crewwork.steps.record import RecordInput

    tid, wid = await new_item(any_store)
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path)))
    await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=1, spec=WorkItemSpec.model_validate(TASK)))

    def awaiting(step: int, attempt: int) -> SetStateInput:
        record = RecordInput(
            work_item_id=wid, tenant_id=tid, step=0, attempt=attempt, verdict="passed", reason="1 test passed"
        )
        return SetStateInput(
            work_item_id=wid,
            tenant_id=tid,
            step=step,
            state=WorkItemState.awaiting_review,
            attempt=attempt,
            record=record,
        )

    assert (await control.set_state(awaiting(5, 1))).ok
    (attempt,) = await any_store.list_attempts(wid)
    row = await any_store.get_work_item(wid)
    assert row is not None and attempt.rank == row.fence_rank == Rank(5, 1).encode()
    assert (attempt.verdict, row.state, row.attempt_count) == ("passed", "awaiting_review", 1)
    # A late copy from an earlier step is refused whole: no attempt 2, no state change.
    await control.set_state(SetStateInput(work_item_id=wid, tenant_id=tid, step=7, state=WorkItemState.validating))
    late = await control.set_state(awaiting(6, 2))
    assert late.stale and not late.ok
    assert [a.number for a in await any_store.list_attempts(wid)] == [1]
    assert (await any_store.get_work_item(wid)).state == "validating"  # type: ignore[union-attr]
