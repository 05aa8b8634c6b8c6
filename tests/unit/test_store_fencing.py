"""The fenced-write path and leases, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.store import AttemptRecord, Store, work_item_fence_key


async def _item(store: Store) -> tuple[str, str]:
    tid = await store.ensure_tenant("fencing")
    row, _ = await store.create_work_item(
        tenant_id=tid,
        spec=WorkItemSpec.model_validate({"kind": "task", "input": {}}),
        base_commit=None,
        repo_path=None,
    )
    return tid, row.id


async def test_stale_token_cannot_overwrite_newer_write(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    key = work_item_fence_key(wid)
    old = await any_store.issue_token(key)
    new = await any_store.issue_token(key)
    assert new > old

    ok = await any_store.set_state(
        work_item_id=wid,
        tenant_id=tid,
        token=new,
        state=WorkItemState.succeeded,
        reason="newer result",
        writer="attempt-2",
        fields={"result": {"by": "new"}},
    )
    late = await any_store.set_state(
        work_item_id=wid,
        tenant_id=tid,
        token=old,
        state=WorkItemState.failed,
        reason="late zombie",
        writer="attempt-1",
        fields={"result": {"by": "old"}},
    )
    assert ok.ok and late.stale and late.current_token == new

    row = await any_store.get_work_item(wid)
    assert row is not None
    assert (row.state, row.reason, row.result, row.result_token) == (
        "succeeded",
        "newer result",
        {"by": "new"},
        new,
    )
    stale_events = [e for e in await any_store.list_events(wid) if e.type == "stale_write_rejected"]
    assert len(stale_events) == 1
    assert stale_events[0].data["presented_token"] == old and stale_events[0].data["current_token"] == new


async def test_stale_attempt_record_changes_nothing(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    key = work_item_fence_key(wid)
    old = await any_store.issue_token(key)
    new = await any_store.issue_token(key)
    newer = AttemptRecord(number=1, verdict="passed", reason="new", agent={"n": 2})
    older = AttemptRecord(number=1, verdict="failed", reason="old", agent={"n": 1})
    assert (await any_store.record_attempt(work_item_id=wid, tenant_id=tid, token=new, record=newer, writer="w2")).ok
    assert (await any_store.record_attempt(work_item_id=wid, tenant_id=tid, token=old, record=older, writer="w1")).stale
    [attempt] = await any_store.list_attempts(wid)
    assert (attempt.verdict, attempt.token, attempt.agent) == ("passed", new, {"n": 2})


async def test_concurrent_token_issuance_is_strictly_increasing_and_unique(any_store: Store) -> None:
    key = "concurrency-test"
    start = await any_store.issue_token(key)

    async def take(n: int) -> list[int]:
        return [await any_store.issue_token(key) for _ in range(n)]

    batches = await asyncio.gather(*(take(10) for _ in range(8)))
    tokens = [t for b in batches for t in b]
    assert len(set(tokens)) == len(tokens) == 80
    assert min(tokens) > start
    for b in batches:  # each acquirer sees its own tokens strictly increase
        assert b == sorted(b) and len(set(b)) == len(b)


async def test_workspace_lease_is_exclusive_until_released(any_store: Store) -> None:
    key = "ws:/repo#main"
    t1, _ = await any_store.acquire_lease(key, "item-a", 60)
    t2, holder = await any_store.acquire_lease(key, "item-b", 60)
    assert t1 is not None and t2 is None and holder == "item-a"
    assert await any_store.renew_lease(key, t1, 60)
    assert await any_store.release_lease(key, token=t1)
    t3, _ = await any_store.acquire_lease(key, "item-b", 60)
    assert t3 is not None and t3 > t1
    assert not await any_store.renew_lease(key, t1, 60)  # the old holder cannot renew
    await any_store.release_lease(key, token=t3)


async def test_expired_lease_can_be_taken_over(any_store: Store) -> None:
    key = "ws:/repo#expiring"
    t1, _ = await any_store.acquire_lease(key, "item-a", 0.2)
    await asyncio.sleep(0.4)
    t2, holder = await any_store.acquire_lease(key, "item-b", 60)
    assert t2 is not None and holder is None and t2 > (t1 or 0)
    assert not await any_store.renew_lease(key, t1 or 0, 60)
    await any_store.release_lease(key, token=t2)


async def test_idempotency_key_returns_the_same_item(any_store: Store) -> None:
    tid = await any_store.ensure_tenant("idem")
    spec = WorkItemSpec.model_validate({"kind": "task", "input": {}, "idempotency_key": "same"})
    a, created_a = await any_store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
    b, created_b = await any_store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
    assert created_a and not created_b and a.id == b.id


async def test_api_keys_are_stored_only_as_hashes(any_store: Store) -> None:
    kid, plain = await any_store.create_api_key("hashing")
    from sqlalchemy import select

    from crewwork.store.tables import ApiKey

    async with any_store.session() as s:
        row = await s.scalar(select(ApiKey).where(ApiKey.id == kid))
    assert row is not None and plain not in (row.key_hash, row.prefix) and len(row.key_hash) == 64
    assert await any_store.authenticate(plain) is not None
    assert await any_store.revoke_api_key(kid)
    assert await any_store.authenticate(plain) is None


def test_secrets_are_masked_when_events_are_written() -> None:
    from crewwork.store.store import mask_secrets

    masked = mask_secrets(
        {
            "msg": "Authorization: Bearer abcdefghijklmnop and sk-1234567890abcdef",
            "nested": ["api_key=supersecretvalue"],
        }
    )
    text = str(masked)
    assert "abcdefghijklmnop" not in text and "sk-1234567890abcdef" not in text and "supersecretvalue" not in text
