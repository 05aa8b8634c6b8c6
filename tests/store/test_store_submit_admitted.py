"""A submission admitted in its own call (`crewwork_submit`, migration 0016; `create_work_item(admit_max_in_flight=)`)
leaves exactly what the two calls it replaces leave (the insert, then the admission's fenced write at rank ADMISSION:
crewwork/admission/starts.py `admit_and_start`), never admits past the tenant's limit however many race, still
refuses a full queue with nothing stored, still answers a repeated idempotency key with its item, and is outranked by
everything the item's workflow writes. On the driver and through SQLAlchemy alike."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from crewwork.admission import starts
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.fencing import FencedWrite, Rank, StateChange
from crewwork.store.store import Store
from crewwork.store.work_items import ADMISSION_RANK, QueueFull

S = WorkItemState


def _spec(key: str | None = None) -> WorkItemSpec:
    return WorkItemSpec.model_validate(
        {
            "kind": "task",
            "input": {"n": 1e16, "z": -0.0},
            "agent": {"name": "scripted", "config": {}},
            "idempotency_key": key,
        }
    )


async def _raw(store: Store, sql: str, **params: Any) -> list[Any]:
    async with store.engine.connect() as c:
        return [tuple(r) for r in (await c.execute(text(sql), params)).all()]


async def _left(store: Store, wid: str) -> dict[str, Any]:
    """Everything stored for the item, ids and clocks left out, JSON as its stored text."""
    [item] = await _raw(
        store,
        "SELECT state, reason, spec::text, labels::text, result IS NULL, fence_rank, state_rank, attempt_count, mock "
        "FROM work_items WHERE id = :w",
        w=wid,
    )
    events = await _raw(store, "SELECT type, data::text, rank FROM events WHERE work_item_id = :w ORDER BY id", w=wid)
    outbox = await _raw(
        store, "SELECT event_type, payload::text, status FROM outbox WHERE work_item_id = :w ORDER BY id", w=wid
    )

    def payload(raw: str) -> Any:
        value = json.loads(raw)
        value.pop("occurred_at", None)
        value.pop("work_item_id", None)
        return value

    return {"item": item, "events": events, "outbox": [(t, payload(p), s) for t, p, s in outbox]}


async def _two_calls(store: Store, tenant: str, max_in_flight: int, key: str | None = None) -> str:
    """What the API did before migration 0016: the insert, then the admission's own fenced write."""
    row, _ = await store.create_work_item(tenant_id=tenant, spec=_spec(key), base_commit=None, repo_path=None)

    async def no_fp(_s: Any, _w: str) -> list[str | None]:
        return []

    await store.admit(FencedWrite(row.id, tenant, starts.ADMISSION, "admission"), max_in_flight, no_fp)
    return row.id


async def _one_call(
    store: Store, tenant: str, max_in_flight: int, key: str | None = None, cap: int | None = None
) -> Any:
    row, created = await store.create_work_item(
        tenant_id=tenant,
        spec=_spec(key),
        base_commit=None,
        repo_path=None,
        max_waiting=cap,
        admit_max_in_flight=max_in_flight,
    )
    return row, created


def test_the_rank_is_the_admissions() -> None:
    assert ADMISSION_RANK == starts.ADMISSION.encode()


@pytest.mark.parametrize("driver", [True, False])
async def test_one_call_leaves_what_the_two_calls_left(pg_url: str, driver: bool) -> None:
    store = Store(pg_url, driver_writes=driver)
    try:
        from crewwork.store.outbox import OutboxStore

        one = await store.ensure_tenant(f"t-submit-one-{uuid.uuid4().hex[:6]}")
        two = await store.ensure_tenant(f"t-submit-two-{uuid.uuid4().hex[:6]}")
        for tenant in (one, two):  # a webhook each: the admission's notification is part of what is left
            await OutboxStore(store).create_webhook(tenant, "https://hooks.example/submit", [])
        # Two admitted, then one queued behind the limit of 2, on each path.
        fused = []
        for _ in range(3):
            row, created = await _one_call(store, one, 2)
            assert created
            fused.append(row)
        split = [await _two_calls(store, two, 2) for _ in range(3)]
        assert [r.state for r in fused] == ["admitted", "admitted", "queued"]
        for row, wid in zip(fused, split, strict=True):
            assert await _left(store, row.id) == await _left(store, wid)
            stored = await store.get_work_item(row.id)
            assert stored is not None
            # The row the call returns is the row stored.
            assert (row.state, row.reason, row.fence_rank, row.state_rank) == (
                stored.state,
                stored.reason,
                stored.fence_rank,
                stored.state_rank,
            )
        assert fused[2].reason == "queued: 2 of the tenant's 2 in-flight places taken, 0 ahead"
    finally:
        await store.close()


async def test_racing_submissions_never_pass_the_limit(pg_url: str) -> None:
    stores = [Store(pg_url), Store(pg_url, driver_writes=False)]
    try:
        tenant = await stores[0].ensure_tenant(f"t-race-{uuid.uuid4().hex[:6]}")
        rows = await asyncio.gather(*(_one_call(stores[i % 2], tenant, 3) for i in range(24)))
        states = [r.state for r, _ in rows]
        assert states.count("admitted") == 3 and states.count("queued") == 21
        stored = await _raw(
            stores[0], "SELECT state, count(*) FROM work_items WHERE tenant_id = :t GROUP BY state", t=tenant
        )
        assert dict(stored) == {"admitted": 3, "queued": 21}
    finally:
        for s in stores:
            await s.close()


async def test_a_full_queue_refuses_and_stores_nothing_and_a_key_returns_its_item(pg_url: str) -> None:
    store = Store(pg_url)
    try:
        tenant = await store.ensure_tenant(f"t-cap-{uuid.uuid4().hex[:6]}")
        first, _ = await _one_call(store, tenant, 1, key="k1", cap=2)
        assert first.state == "admitted"  # admitted: it does not wait
        for _ in range(2):
            row, _ = await _one_call(store, tenant, 1, cap=2)
            assert row.state == "queued"
        with pytest.raises(QueueFull):
            await _one_call(store, tenant, 1, cap=2)
        assert await _raw(store, "SELECT count(*) FROM work_items WHERE tenant_id = :t", t=tenant) == [(3,)]
        assert await _raw(store, "SELECT count(*) FROM events WHERE tenant_id = :t", t=tenant) == [(6,)]
        again, created = await _one_call(store, tenant, 1, key="k1", cap=2)
        assert not created and again.id == first.id
    finally:
        await store.close()


async def test_the_workflow_outranks_the_admission_and_a_late_admission_is_refused(pg_url: str) -> None:
    store = Store(pg_url)
    try:
        tenant = await store.ensure_tenant(f"t-rank-{uuid.uuid4().hex[:6]}")
        row, _ = await _one_call(store, tenant, 5)
        assert row.state == "admitted" and row.fence_rank == ADMISSION_RANK
        w = FencedWrite(row.id, tenant, Rank(1, 1), "run_agent")
        assert (await store.set_state(StateChange(w, state=S.running))).ok

        async def no_fp(_s: Any, _w: str) -> list[str | None]:
            return []

        # An admission made again now (an idempotent retry of the request, the reconciler) is stale.
        late = await store.admit(FencedWrite(row.id, tenant, starts.ADMISSION, "admission"), 5, no_fp)
        assert not late.ok
        stored = await store.get_work_item(row.id)
        assert stored is not None and stored.state == "running"
    finally:
        await store.close()
