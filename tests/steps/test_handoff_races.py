"""Races of the hand-off (`FencingStore.hand_off`) and the fenced write's first statement, on real PostgreSQL with
real concurrency: another transaction holds a lock the write needs, and something changes while it waits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select, text

from crewwork.config import Settings
from crewwork.models import WorkItemResult, WorkItemSpec, WorkItemState
from crewwork.steps.admit import AdmitInput
from crewwork.steps.finish import FinishInput
from crewwork.steps.ports import Ports
from crewwork.steps.registry import bound
from crewwork.store.fencing import FencedWrite, StateChange
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import Rank, Store
from crewwork.store.tables import OutboxMessage

TASK = {"kind": "task", "input": {}}


async def _item(store: Store, tenant: str) -> tuple[str, str]:
    tid = await store.ensure_tenant(tenant)
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
    )
    return tid, row.id


async def _outbox_states(store: Store, wid: str) -> list[str]:
    async with store.session() as s:
        rows = (await s.scalars(select(OutboxMessage).where(OutboxMessage.work_item_id == wid))).all()
    return [str(r.payload.get("state")) for r in rows]


async def _wait_blocked(store: Store, count: int = 1) -> None:
    """Until `count` backends of this database wait for a lock."""
    for _ in range(200):
        async with store.session() as s:
            n = await s.scalar(
                select(func.count())
                .select_from(text("pg_stat_activity"))
                .where(text("datname = current_database() AND wait_event_type = 'Lock'"))
            )
        if int(n or 0) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the write never waited for the lock")


async def test_a_webhook_registered_while_a_state_change_waits_for_the_item_row_gets_that_change(
    pg_store: Store,
) -> None:
    """The state change commits after the webhook was registered, so its notification must be in the outbox with
    it. The webhook lookup used to be the outbox insert's own statement (after every lock wait); reading it in the
    write's first statement, whose snapshot predates the wait for the row lock, lost the change."""
    store = pg_store
    tid, wid = await _item(store, "hook-race-row")
    assert (
        await store.set_state(
            StateChange(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="t"), state=WorkItemState.admitted
            )
        )
    ).ok
    async with store.engine.connect() as side:
        # Another writer of the item (a concurrent step) holds its row.
        await side.execute(text("SELECT id FROM work_items WHERE id = :w FOR UPDATE"), {"w": wid})
        write = asyncio.create_task(
            store.set_state(
                StateChange(
                    FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(2, 1), writer="t"),
                    state=WorkItemState.running,
                )
            )
        )
        await _wait_blocked(store)
        await OutboxStore(store).create_webhook(tid, "http://127.0.0.1:9/hook", [])
        await side.commit()
    assert (await asyncio.wait_for(write, 10)).ok
    assert await _outbox_states(store, wid) == ["running"]


async def test_a_webhook_registered_while_a_hand_off_waits_for_the_tenant_lock_gets_both_changes(
    pg_store: Store, tmp_path: Any
) -> None:
    """An ending item waits for the tenant lock (another item's admission holds it) before handing its place on.
    A webhook registered meanwhile precedes both commits: the ending item's change and the handed item's `admitted`
    must both be in the outbox."""
    store = pg_store
    control = bound(Ports.build(store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate(TASK)
    (tid, first), (_, second) = await _item(store, "hook-race-tenant"), await _item(store, "hook-race-tenant")
    assert (await control.admit(AdmitInput(work_item_id=first, tenant_id=tid, step=1, spec=spec))).admitted
    assert not (await control.admit(AdmitInput(work_item_id=second, tenant_id=tid, step=1, spec=spec))).admitted
    result = WorkItemResult(work_item_id=first, state=WorkItemState.succeeded, reason="done")
    async with store.engine.connect() as side:
        # Another admission of the tenant holds the tenant lock.
        await side.execute(text("SELECT id FROM tenants WHERE id = :t FOR NO KEY UPDATE"), {"t": tid})
        finish = asyncio.create_task(
            control.finish(FinishInput(work_item_id=first, tenant_id=tid, step=2, result=result))
        )
        await _wait_blocked(store)
        await OutboxStore(store).create_webhook(tid, "http://127.0.0.1:9/hook", [])
        await side.commit()
    assert (await asyncio.wait_for(finish, 10)).ok
    assert (await store.get_work_item(second)).state == "admitted"  # type: ignore[union-attr]
    assert await _outbox_states(store, first) == ["succeeded"]
    assert await _outbox_states(store, second) == ["admitted"]


@pytest.mark.parametrize("server", [True, False])
async def test_a_queued_item_cancelled_while_a_place_is_handed_on_passes_the_place_to_the_next(
    pg_store: Store, tmp_path: Any, server: bool
) -> None:
    """The first queued item's row is locked (a transaction holds it, as a paused process would) and its
    cancellation waits for it while the admitted item ends: the hand-off skips the locked row, taking it for the
    item's own admission, and leaves the place to it. The cancellation must then pass the place to the next in
    line; it used to hand nothing on (a queued item holds no place), and the next item waited for its fallback
    timer with a place free."""
    store = pg_store
    store.server_writes = server
    control = bound(Ports.build(store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [await _item(store, f"cancel-race-{server}") for _ in range(3)]
    tid = items[0][0]
    got = [await control.admit(AdmitInput(work_item_id=w, tenant_id=tid, step=1, spec=spec)) for _t, w in items]
    assert [g.admitted for g in got] == [True, False, False]
    (_, running), (_, cancelling), (_, behind) = items
    async with store.engine.connect() as holder:
        await holder.execute(text("SELECT id FROM work_items WHERE id = :w FOR UPDATE"), {"w": cancelling})
        cancel = asyncio.create_task(
            store.set_state(
                StateChange(
                    FencedWrite(work_item_id=cancelling, tenant_id=tid, rank=Rank(2, 1), writer="finish#1"),
                    state=WorkItemState.cancelled,
                    reason="cancelled by request",
                    max_in_flight=1,
                    hand_off_cap=3,
                )
            )
        )
        await _wait_blocked(store)
        result = WorkItemResult(work_item_id=running, state=WorkItemState.succeeded, reason="done")
        finish = await asyncio.wait_for(
            control.finish(FinishInput(work_item_id=running, tenant_id=tid, step=2, result=result)), 10
        )
        assert finish.ok
        assert (await store.get_work_item(behind)).state == "queued"  # type: ignore[union-attr]
        await holder.rollback()
    assert (await asyncio.wait_for(cancel, 10)).ok
    states = [(await store.get_work_item(w)).state for w in (running, cancelling, behind)]  # type: ignore[union-attr]
    assert states == ["succeeded", "cancelled", "admitted"], "the free place went to nobody"


async def test_places_left_to_items_admitting_themselves_do_not_use_up_the_hand_off(
    pg_store: Store, tmp_path: Any
) -> None:
    """All four admitted items end while the first three queued items are admitting themselves (each holds its row,
    waiting for the tenant lock: here held open by other connections). Each hand-off leaves those three their
    places; the last one ends with four places free, three of them taken by those admissions, so the fourth queued
    item (which asked, and was queued behind them) must get the fourth place. The hand-off looked at no more than
    `HAND_OFF_CAP` (3) items, all of them locked, and the fourth waited for its fallback timer with a place free
    (what tests/store/test_store_fencing.py's 40-item race caught now and then)."""
    store = pg_store
    limit = 4
    control = bound(Ports.build(store, Settings(data_dir=tmp_path, tenant_max_in_flight=limit)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [(await _item(store, "self-admitting"))[1] for _ in range(8)]
    tid = (await store.get_work_item(items[0])).tenant_id  # type: ignore[union-attr]
    got = [await control.admit(AdmitInput(work_item_id=w, tenant_id=tid, step=1, spec=spec)) for w in items]
    assert [g.admitted for g in got] == [True] * 4 + [False] * 4
    flying, admitting, behind = items[:4], items[4:7], items[7]
    sides = [await store.engine.connect() for _ in admitting]
    try:
        for side, wid in zip(sides, admitting, strict=True):
            await side.execute(text("SELECT id FROM work_items WHERE id = :w FOR UPDATE"), {"w": wid})
        for wid in flying:
            result = WorkItemResult(work_item_id=wid, state=WorkItemState.succeeded, reason="done")
            assert (await control.finish(FinishInput(work_item_id=wid, tenant_id=tid, step=2, result=result))).ok
    finally:
        for side in sides:
            await side.rollback()
            await side.close()
    # The three admissions that held their rows go on, and find their places.
    for wid in admitting:
        assert (await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=2, spec=spec))).admitted
    assert (await store.get_work_item(behind)).state == "admitted", "a place free, and the item that asked waits"  # type: ignore[union-attr]
