"""Forge intake's store (crewwork/store/forge.py) on SQLite and PostgreSQL: a delivery id is accepted once, a trigger
is queued once whatever delivers it (concurrent deliveries under different ids included), and a claimed trigger is
hidden from a second claimer until its claim expires."""

from __future__ import annotations

import asyncio
import uuid

from crewwork.store.forge import ForgeStore, Subscription
from crewwork.store.store import Store


async def subscribed(store: Store) -> tuple[ForgeStore, Subscription]:
    tenant_id = await store.ensure_tenant(f"forge-{uuid.uuid4().hex[:6]}")
    repo = await store.create_repository(tenant_id=tenant_id, url=f"https://github.com/acme/{uuid.uuid4().hex[:6]}")
    forges = ForgeStore(store)
    sub = await forges.subscribe(tenant_id=tenant_id, repository_id=repo.id, dialect="github", settings={"x": 1})
    return forges, sub


async def test_a_delivery_is_accepted_once_and_a_trigger_queued_once(any_store: Store) -> None:
    forges, sub = await subscribed(any_store)
    first = await forges.accept(sub, "d1", "issues", "issue:1:label:crewwork", {"kind": "label"})
    assert first.outcome == "queued" and first.trigger_id is not None
    assert (await forges.accept(sub, "d1", "issues", "issue:1:label:crewwork", {"kind": "label"})).outcome == (
        "duplicate_delivery"
    )
    assert (await forges.accept(sub, "d2", "issues", "issue:1:label:crewwork", {"kind": "label"})).outcome == (
        "duplicate_trigger"
    )
    assert (await forges.accept(sub, "d3", "ping", None, None)).outcome == "ignored"
    assert await forges.delivery_outcomes(sub.id) == {
        "d1": "queued",
        "d2": "duplicate_trigger",
        "d3": "ignored",
    }
    # Subscribing again keeps the secret (the forge's webhook keeps working) and replaces the settings.
    again = await forges.subscribe(
        tenant_id=sub.tenant_id, repository_id=sub.repository_id, dialect="github", settings={"x": 2}
    )
    assert (again.id, again.secret, again.settings) == (sub.id, sub.secret, {"x": 2})


async def test_concurrent_deliveries_of_one_trigger_queue_it_once(any_store: Store) -> None:
    # Deliveries of one trigger under new ids racing deliveries of one id (redeliveries): every one is answered,
    # none is an error, and the trigger is queued once. Several rounds, since a race is not met every time.
    forges, sub = await subscribed(any_store)
    for round_ in range(5):
        key = f"comment:{round_}"
        outcomes = await asyncio.gather(
            *(forges.accept(sub, f"d{round_}-{i}", "issue_comment", key, {"kind": "comment"}) for i in range(8)),
            *(forges.accept(sub, f"same-{round_}", "issue_comment", key, {"kind": "comment"}) for _ in range(8)),
        )
        assert [o.outcome for o in outcomes].count("queued") == 1, outcomes
    assert len(await forges.triggers(sub.tenant_id, sub.id)) == 5
    assert len(await forges.delivery_outcomes(sub.id)) == 5 * 9


async def test_a_claimed_trigger_is_not_claimed_again_until_its_claim_expires(any_store: Store) -> None:
    forges, sub = await subscribed(any_store)
    await forges.accept(sub, "d1", "issues", "issue:2:label:crewwork", {"kind": "label"})
    mine = [c for c in await forges.claim_triggers(50, 60) if c.subscription_id == sub.id]
    assert len(mine) == 1
    assert [c for c in await forges.claim_triggers(50, 60) if c.subscription_id == sub.id] == []
    status = await forges.retry_trigger(mine[0].id, "forge down", max_attempts=3, backoff_s=0.0)
    assert status == "pending"
    again = [c for c in await forges.claim_triggers(50, 60) if c.subscription_id == sub.id]
    assert len(again) == 1
    await forges.finish_trigger(again[0].id, "submitted", work_item_id="wi_1")
    [row] = await forges.triggers(sub.tenant_id, sub.id)
    assert (row.status, row.work_item_id, row.attempts) == ("submitted", "wi_1", 2)


async def test_forgetting_old_deliveries_never_lets_their_trigger_run_twice(any_store: Store) -> None:
    forges, sub = await subscribed(any_store)
    assert (await forges.accept(sub, "old", "issues", "issue:3:label:crewwork", {"kind": "label"})).outcome == "queued"
    await asyncio.sleep(0.05)
    assert await forges.prune_deliveries(0.01) >= 1
    assert "old" not in await forges.delivery_outcomes(sub.id)
    # The same delivery, replayed after it was forgotten: a new delivery of a trigger that is still kept.
    replayed = await forges.accept(sub, "old", "issues", "issue:3:label:crewwork", {"kind": "label"})
    assert replayed.outcome == "duplicate_trigger"
    assert len(await forges.triggers(sub.tenant_id, sub.id)) == 1
