"""The webhook deliverer's idle poll (crewwork/store/outbox.py `any_due`): every API process polls the outbox twice
a second, so with nothing due a poll is one indexed read outside a transaction; with a row due, the claim runs as
before and takes exactly the due rows."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from sqlalchemy import select, update

from crewwork.store.db import upgrade
from crewwork.store.outbox import OutboxStore, enqueue
from crewwork.store.store import Store
from crewwork.store.tables import OutboxMessage
from tests.conftest import statements_sent


async def test_an_idle_poll_claims_nothing_and_a_due_row_is_claimed_once(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'outbox.db'}"
    await upgrade(url)
    store = Store(url)
    try:
        tenant_id = await store.ensure_tenant("t-outbox")
        outbox = OutboxStore(store)
        await outbox.create_webhook(tenant_id, "https://hooks.example/a", [])
        assert not await outbox.any_due()
        assert await outbox.claim_due(10, 30) == []

        async with store.session() as s:
            for n in (1, 2):
                await enqueue(
                    s,
                    tenant_id=tenant_id,
                    work_item_id=f"wi_{n}",
                    event_type="work_item.state_changed",
                    payload={"n": n},
                    now=time.time() - 1,
                )
        # The second row falls due only in an hour: the poll sees the first, the claim takes only it.
        async with store.session() as s:
            await s.execute(
                update(OutboxMessage)
                .where(OutboxMessage.work_item_id == "wi_2")
                .values(next_attempt_at=time.time() + 3600)
            )
        assert await outbox.any_due()
        claimed = await outbox.claim_due(10, 30)
        assert [c.payload for c in claimed] == [{"n": 1}]
        # Claimed: pushed 30 s ahead, so it is not due again, and nothing else is.
        assert not await outbox.any_due()
        assert await outbox.claim_due(10, 30) == []
    finally:
        await store.close()


async def test_on_postgresql_the_idle_probe_is_one_statement(pg_url: str) -> None:
    store = Store(pg_url, pool_size=1)
    try:
        outbox = OutboxStore(store)
        await outbox.any_due()  # the pool's connection exists
        with statements_sent(store) as statements:
            await outbox.any_due()
        assert len(statements) == 1 and "outbox" in statements[0].lower(), statements
    finally:
        await store.close()


async def test_a_delivery_says_which_kind_of_item_it_is_about_and_whether_its_agent_is_a_mock(any_store: Store) -> None:
    """The body a receiver gets carries the item's `kind` and `mock` label (read at delivery from the item); the
    stored notification stays as the change wrote it."""
    from crewwork.models import WorkItemSpec

    tenant_id = await any_store.ensure_tenant(f"t-about-{uuid.uuid4().hex[:8]}")
    outbox = OutboxStore(any_store)
    hook = await outbox.create_webhook(tenant_id, "https://hooks.example/about", [])
    spec = WorkItemSpec.model_validate({"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {}}})
    items = {}
    for mock in (True, False):
        row, _ = await any_store.create_work_item(
            tenant_id=tenant_id, spec=spec, base_commit=None, repo_path=None, mock=mock
        )
        items[row.id] = mock
        async with any_store.session() as s:
            await enqueue(
                s,
                tenant_id=tenant_id,
                work_item_id=row.id,
                event_type="work_item.state_changed",
                payload={"work_item_id": row.id, "state": "running", "reason": ""},
                # Due long ago: first in the claim's order, ahead of whatever earlier tests on this database left.
                now=time.time() - 10**6,
            )
    claimed = [c for c in await outbox.claim_due(100, 30) if c.payload["work_item_id"] in items]
    assert {c.payload["work_item_id"]: (c.payload["kind"], c.payload["mock"]) for c in claimed} == {
        wid: ("task", mock) for wid, mock in items.items()
    }
    async with any_store.session() as s:
        stored = (await s.scalars(select(OutboxMessage.payload).where(OutboxMessage.webhook_id == hook.id))).all()
    assert all("mock" not in p and "kind" not in p for p in stored), stored
