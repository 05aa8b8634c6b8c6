"""Fencing in scheduling order, leases and the store's write paths, on SQLite and on PostgreSQL.

A write's rank is (workflow step, Temporal attempt), fixed when Temporal scheduled it; the store accepts it only if
no higher rank has been accepted for the item."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.fencing import FencedWrite, StateChange
from crewwork.store.store import AttemptRecord, Rank, Store
from crewwork.store.tables import ApiKey
from tests.steps.items import new_item, set_state_at


def test_ranks_order_by_step_then_attempt_and_survive_their_integer_encoding() -> None:
    ranks = [Rank(0, 0), Rank(1, 1), Rank(1, 2), Rank(2, 1), Rank(10**9, 999_999)]
    assert sorted(ranks) == ranks
    assert [Rank.decode(r.encode()) for r in ranks] == ranks
    assert sorted(r.encode() for r in ranks) == [r.encode() for r in ranks]
    with pytest.raises(ValueError):
        Rank(1, Rank.SPAN)


async def test_a_late_attempt_is_refused_at_its_first_write_whenever_it_wakes(any_store: Store) -> None:
    """The commonest zombie: attempt 1 of a step paused before its first write while attempt 2 ran and the workflow
    moved on. Its first write, whenever it arrives, ranks below what was accepted and changes nothing."""
    _tid, wid = await new_item(any_store)
    assert (await set_state_at(any_store, wid, Rank(3, 2), WorkItemState.running, "run_agent#2")).ok
    assert (await set_state_at(any_store, wid, Rank(4, 1), WorkItemState.awaiting_review, "set_state#1")).ok
    late = await set_state_at(any_store, wid, Rank(3, 1), WorkItemState.running, "run_agent#1")
    assert late.stale and not late.closed and late.current == Rank(4, 1)
    row = await any_store.get_work_item(wid)
    assert row is not None and (row.state, row.fence_rank) == ("awaiting_review", Rank(4, 1).encode())
    [rejected] = [e for e in await any_store.list_events(wid) if e.type == "stale_write_rejected"]
    assert rejected.data["presented"] == {"step": 3, "attempt": 1}
    assert rejected.data["current"] == {"step": 4, "attempt": 1} and rejected.data["writer"] == "run_agent#1"


async def test_an_older_attempt_of_the_same_step_loses_once_a_newer_one_has_written(any_store: Store) -> None:
    tid, wid = await new_item(any_store)
    assert (await set_state_at(any_store, wid, Rank(2, 1), WorkItemState.running, "run_agent#1")).ok
    assert (await set_state_at(any_store, wid, Rank(2, 2), WorkItemState.running, "run_agent#2")).ok
    done = await any_store.fenced_event(
        FencedWrite(rank=Rank(2, 1), work_item_id=wid, tenant_id=tid, writer="run_agent#1"),
        type_="agent_finished",
        data={},
    )
    assert done.stale
    ok = await any_store.fenced_event(
        FencedWrite(rank=Rank(2, 2), work_item_id=wid, tenant_id=tid, writer="run_agent#2"),
        type_="agent_finished",
        data={},
    )
    assert ok.ok
    finished = [e for e in await any_store.list_events(wid) if e.type == "agent_finished"]
    assert [Rank.decode(e.rank or 0) for e in finished] == [Rank(2, 2)]


async def test_equal_ranks_are_one_scheduled_attempt_and_both_copies_are_accepted(any_store: Store) -> None:
    """A local activity re-run after its workflow task moved to another worker presents the same rank with the same
    input: accepting it again must not fail, and must not lower anything."""
    _tid, wid = await new_item(any_store)
    for _ in range(2):
        assert (await set_state_at(any_store, wid, Rank(5, 1), WorkItemState.running, "set_state#1")).ok
    row = await any_store.get_work_item(wid)
    assert row is not None and row.fence_rank == Rank(5, 1).encode()


async def test_a_terminal_item_refuses_every_later_write_even_a_higher_ranked_one(any_store: Store) -> None:
    _tid, wid = await new_item(any_store)
    assert (
        await set_state_at(
            any_store, wid, Rank(7, 1), WorkItemState.succeeded, "finish#1", fields={"result": {"by": "w"}}
        )
    ).ok
    late = await set_state_at(any_store, wid, Rank(9, 1), WorkItemState.running, "run_agent#1")
    assert late.closed and late.state == "succeeded"
    row = await any_store.get_work_item(wid)
    assert row is not None and (row.state, row.result, row.result_rank) == ("succeeded", {"by": "w"}, 7_000_001)
    assert "write_after_terminal_rejected" in [e.type for e in await any_store.list_events(wid)]


async def test_a_stale_attempt_record_changes_nothing(any_store: Store) -> None:
    tid, wid = await new_item(any_store)
    newer = AttemptRecord(number=1, verdict="passed", reason="new", agent={"n": 2})
    older = AttemptRecord(number=1, verdict="failed", reason="old", agent={"n": 1})
    assert (
        await any_store.record_attempt(
            FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(4, 1), writer="w2"), record=newer
        )
    ).ok
    assert (
        await any_store.record_attempt(
            FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(3, 1), writer="w1"), record=older
        )
    ).stale
    [attempt] = await any_store.list_attempts(wid)
    assert (attempt.verdict, attempt.rank, attempt.agent) == ("passed", Rank(4, 1).encode(), {"n": 2})


async def test_workspace_lease_is_exclusive_until_released(any_store: Store) -> None:
    key = "ws:/repo#main"
    g1, _ = await any_store.acquire_lease(key, "item-a", 60)
    g2, holder = await any_store.acquire_lease(key, "item-b", 60)
    assert g1 is not None and g2 is None and holder == "item-a"
    assert await any_store.renew_lease(key, g1, 60)
    assert await any_store.release_lease(key, grant=g1)
    g3, _ = await any_store.acquire_lease(key, "item-b", 60)
    assert g3 is not None and g3 > g1
    assert not await any_store.renew_lease(key, g1, 60)  # the old holder cannot renew
    await any_store.release_lease(key, grant=g3)


@pytest.mark.postgres
async def test_a_grant_that_waited_for_a_release_starts_after_that_release_ended(pg_store: Store) -> None:
    """An acquirer held up behind the key's counter lock while the holder releases: its grant must start after the
    release's end on the database clock (read before the wait, it started earlier, and lease_history overlapped:
    the chaos soak's lease_exclusive check failed on it)."""
    from sqlalchemy import text

    from crewwork.store.tables import LeaseHistory

    key = "ws:/repo#waited"
    g1, _ = await pg_store.acquire_lease(key, "item-a", 60)
    assert g1 is not None
    blocker = await pg_store.engine.connect()
    try:
        await blocker.begin()
        # Hold the key's grant counter row: the next acquirer waits on it, inside its transaction.
        await blocker.execute(text("SELECT token FROM fences WHERE key = :k FOR UPDATE"), {"k": key})
        acquiring = asyncio.create_task(pg_store.acquire_lease(key, "item-b", 60))
        await asyncio.sleep(0.3)
        assert not acquiring.done()
        assert await pg_store.release_lease(key, grant=g1)
        await blocker.rollback()
        g2, holder = await acquiring
    finally:
        await blocker.close()
    assert g2 is not None and holder is None
    async with pg_store.session() as s:
        rows = (await s.scalars(select(LeaseHistory).where(LeaseHistory.key == key))).all()
    first, second = sorted(rows, key=lambda h: h.token)
    assert first.ended_at is not None and second.acquired_at >= first.ended_at, (first.ended_at, second.acquired_at)
    await pg_store.release_lease(key, grant=g2)


async def test_expired_lease_can_be_taken_over(any_store: Store) -> None:
    key = "ws:/repo#expiring"
    g1, _ = await any_store.acquire_lease(key, "item-a", 0.2)
    await asyncio.sleep(0.4)
    g2, holder = await any_store.acquire_lease(key, "item-b", 60)
    assert g2 is not None and holder is None and g2 > (g1 or 0)
    assert not await any_store.renew_lease(key, g1 or 0, 60)
    await any_store.release_lease(key, grant=g2)


async def test_idempotency_key_returns_the_same_item(any_store: Store) -> None:
    tid = await any_store.ensure_tenant("idem")
    spec = WorkItemSpec.model_validate({"kind": "task", "input": {}, "idempotency_key": "same"})
    a, created_a = await any_store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
    b, created_b = await any_store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
    assert created_a and not created_b and a.id == b.id


async def test_api_keys_are_stored_only_as_hashes(any_store: Store) -> None:
    kid, plain = await any_store.create_api_key("hashing")
    async with any_store.session() as s:
        row = await s.scalar(select(ApiKey).where(ApiKey.id == kid))
    assert row is not None and plain not in (row.key_hash, row.prefix) and len(row.key_hash) == 64
    assert await any_store.authenticate(plain) is not None
    assert await any_store.revoke_api_key(kid)
    assert await any_store.authenticate(plain) is None


def test_secrets_are_masked_when_events_are_written() -> None:
    from crewwork.boundary.masking import mask_secrets

    masked = mask_secrets(
        {
            "msg": "Authorization: Bearer abcdefghijklmnop and sk-1234567890abcdef",
            "nested": ["api_key=supersecretvalue"],
        }
    )
    text = str(masked)
    assert "abcdefghijklmnop" not in text and "sk-1234567890abcdef" not in text and "supersecretvalue" not in text


async def test_a_fenced_write_survives_its_pooled_connection_being_killed_without_pre_ping(pg_url: str) -> None:
    """The worker pools run without pre-ping: a fenced write whose pooled connection PostgreSQL has closed runs once
    more on a fresh connection, and is applied exactly once."""
    import asyncpg  # the driver the store uses on PostgreSQL

    store = Store(pg_url, pool_size=2, pre_ping=False)
    try:
        tid, wid = await new_item(store)
        async with store.session() as s:  # make sure a pooled connection exists, and learn its backend
            conn = await s.connection()
            pid = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
        admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        res = await store.set_state(
            StateChange(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="after-kill"),
                state=WorkItemState.running,
            )
        )
        assert res.ok
        changes = [e for e in await store.list_events(wid) if e.type == "state_changed"]
        assert [e.data["state"] for e in changes] == ["running"]
        art = await store.put_artifact(work_item_id=wid, tenant_id=tid, name="t.txt", data=b"x")
        assert (await store.artifact_content(art.id)) == b"x"
    finally:
        await store.close()


@pytest.mark.parametrize("pre_ping", [True, False], ids=["api", "pools"])
async def test_a_read_never_draws_a_pooled_connection_the_server_has_just_closed(pg_url: str, pre_ping: bool) -> None:
    """A connection returned to the pool a moment ago (too recently to be pinged) and then ended by the server (a
    restart, a failover, pg_terminate_backend) is known closed to the driver: the next read gets another one instead
    of failing with "connection is closed" (seen in tests/reliability/test_faults.py under load)."""
    import asyncpg

    store = Store(pg_url, pool_size=1, pre_ping=pre_ping)
    try:
        _tid, wid = await new_item(store)
        async with store.session() as s:
            pid = (await (await s.connection()).exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
        admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        await asyncio.sleep(0.2)  # the driver sees the socket close; still well inside PING_AFTER_IDLE_S
        events = await store.list_events(wid)  # a read in a session: not retried by the store
        assert [e.type for e in events][:1] == ["submitted"]
    finally:
        await store.close()


async def test_concurrent_writers_of_one_item_never_accept_a_lower_rank_after_a_higher_one(pg_url: str) -> None:
    """Many attempts race on PostgreSQL: whatever order they commit in, accepted ranks only rise."""
    store = Store(pg_url, pool_size=10)
    try:
        _tid, wid = await new_item(store)
        ranks = [Rank(step, attempt) for step in range(1, 9) for attempt in (1, 2, 3)]
        import random

        random.Random(7).shuffle(ranks)
        await asyncio.gather(*(set_state_at(store, wid, r, WorkItemState.running, f"w{r}") for r in ranks))
        accepted = [Rank.decode(e.rank or 0) for e in await store.list_events(wid) if e.type == "state_changed"]
        assert accepted == sorted(accepted) and accepted[-1] == Rank(8, 3)
        row = await store.get_work_item(wid)
        assert row is not None and row.fence_rank == Rank(8, 3).encode()
    finally:
        await store.close()


@pytest.mark.postgres
async def test_the_autocommit_submission_leaves_its_pooled_connection_transactional(pg_url: str) -> None:
    """The submission runs as one statement outside a transaction (AUTOCOMMIT on its connection). The pool must hand
    that connection back transactional: a fenced write's lock and change on an autocommit connection would each
    commit on their own."""
    from sqlalchemy import text

    store = Store(pg_url, pool_size=1)
    try:
        tid, _wid = await new_item(store)
        async with store.session() as s:
            first = (await s.execute(text("SELECT txid_current()"))).scalar()
            second = (await s.execute(text("SELECT txid_current()"))).scalar()
        assert first == second, "two statements of one session ran in two transactions"
        assert tid
    finally:
        await store.close()
