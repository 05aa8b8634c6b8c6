"""A tenant's queue has a limit (CREWWORK_TENANT_MAX_QUEUED; crewwork/store/work_items.py `create_work_item`): a
submission that would make more than `max_waiting` of the tenant's items wait for a place (`submitted` or `queued`)
is refused with `QueueFull` and leaves nothing behind, no row and no event; items in any other state, and other
tenants' items, do not count; a repeated idempotency key still returns its item. On PostgreSQL the check is part of
the submission's one statement."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import func, select, update

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.store import Store
from crewwork.store.tables import Event, WorkItem
from crewwork.store.work_items import QueueFull
from tests.conftest import statements_sent


def _spec(key: str | None = None) -> WorkItemSpec:
    return WorkItemSpec.model_validate(
        {"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {}}, "idempotency_key": key}
    )


async def _submit(store: Store, tenant_id: str, key: str | None = None, cap: int | None = 2) -> str:
    row, _created = await store.create_work_item(
        tenant_id=tenant_id, spec=_spec(key), base_commit=None, repo_path=None, max_waiting=cap
    )
    return row.id


async def _stored(store: Store, tenant_id: str) -> tuple[int, int]:
    async with store.session() as s:
        items = (await s.execute(select(func.count()).where(WorkItem.tenant_id == tenant_id))).scalar_one()
        events = (await s.execute(select(func.count()).where(Event.tenant_id == tenant_id))).scalar_one()
    return int(items), int(events)


async def _set_state(store: Store, wid: str, state: WorkItemState) -> None:
    async with store.session() as s:
        await s.execute(update(WorkItem).where(WorkItem.id == wid).values(state=state.value))


async def test_a_full_queue_refuses_the_submission_and_stores_nothing(any_store: Store) -> None:
    tenant = await any_store.ensure_tenant(f"t-queue-{uuid.uuid4().hex[:8]}")
    other = await any_store.ensure_tenant(f"t-other-{uuid.uuid4().hex[:8]}")
    first = await _submit(any_store, tenant, key="k-first")  # submitted: it waits
    second = await _submit(any_store, tenant)
    await _set_state(any_store, second, WorkItemState.queued)
    assert await _stored(any_store, tenant) == (2, 2)

    with pytest.raises(QueueFull) as refused:
        await _submit(any_store, tenant)
    assert "2 or more work items waiting" in str(refused.value) and "CREWWORK_TENANT_MAX_QUEUED" in str(refused.value)
    assert await _stored(any_store, tenant) == (2, 2), "a refused submission left a row or an event"

    # The same submission again under its key is the same item, full queue or not.
    assert await _submit(any_store, tenant, key="k-first") == first
    # Another tenant's queue is its own.
    await _submit(any_store, other)

    # Admitted, running and ended items hold no place in the queue.
    await _set_state(any_store, first, WorkItemState.running)
    third = await _submit(any_store, tenant)
    with pytest.raises(QueueFull):
        await _submit(any_store, tenant)
    await _set_state(any_store, second, WorkItemState.succeeded)
    await _set_state(any_store, third, WorkItemState.admitted)
    await _submit(any_store, tenant)
    await _submit(any_store, tenant)
    with pytest.raises(QueueFull):
        await _submit(any_store, tenant)
    # Without a limit (callers other than the API's submission), nothing is counted.
    await _submit(any_store, tenant, cap=None)
    assert (await _stored(any_store, tenant))[0] == 6


async def test_copies_of_one_submission_racing_for_the_last_place_all_get_its_item(any_store: Store) -> None:
    """A client's retries racing its first try, under one idempotency key, when that item takes the tenant's last
    place: every copy answers with the one item, none is refused as if the queue were full of others."""
    for _round in range(10):
        tenant = await any_store.ensure_tenant(f"t-race-{uuid.uuid4().hex[:8]}")
        ids = await asyncio.gather(*(_submit(any_store, tenant, key="same", cap=1) for _ in range(8)))
        assert len(set(ids)) == 1, ids
        assert await _stored(any_store, tenant) == (1, 1)


async def test_on_postgresql_the_limit_is_checked_by_the_submission_statement_itself(pg_store: Store) -> None:
    tenant = await pg_store.ensure_tenant(f"t-queue-{uuid.uuid4().hex[:8]}")
    await _submit(pg_store, tenant, cap=1)
    with statements_sent(pg_store) as sent:
        with pytest.raises(QueueFull):
            await _submit(pg_store, tenant, cap=1)
    assert len(sent) == 1 and "insert into work_items" in sent[0].lower(), sent
    assert await _stored(pg_store, tenant) == (1, 1)
