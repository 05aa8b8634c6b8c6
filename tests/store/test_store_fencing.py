"""Fencing in scheduling order, leases and the store's write paths, on SQLite and on PostgreSQL.

A write's rank is (workflow step, Temporal attempt), fixed when Temporal scheduled it; the store accepts it only if
no higher rank has been accepted for the item."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select

from crewwork.config import Settings
from crewwork.models import WorkItemResult, WorkItemSpec, WorkItemState
from crewwork.steps.admit import AdmitInput
from crewwork.steps.attempt import AttemptWriter, watch
from crewwork.steps.finish import FinishInput
from crewwork.steps.ports import Ports
from crewwork.steps.registry import bound
from crewwork.steps.state import SetStateInput
from crewwork.store.store import AttemptRecord, Rank, Store
from crewwork.store.tables import ApiKey

TASK = {"kind": "task", "input": {}}


async def _item(store: Store, tenant: str = "fencing", **spec: Any) -> tuple[str, str]:
    tid = await store.ensure_tenant(tenant)
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate({**TASK, **spec}), base_commit=None, repo_path=None
    )
    return tid, row.id


async def _state(store: Store, wid: str, rank: Rank, state: WorkItemState, writer: str, **kw: Any) -> Any:
    tid = (await store.get_work_item(wid)).tenant_id  # type: ignore[union-attr]
    return await store.set_state(work_item_id=wid, tenant_id=tid, rank=rank, state=state, writer=writer, **kw)


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
    _tid, wid = await _item(any_store)
    assert (await _state(any_store, wid, Rank(3, 2), WorkItemState.running, "run_agent#2")).ok
    assert (await _state(any_store, wid, Rank(4, 1), WorkItemState.awaiting_review, "set_state#1")).ok
    late = await _state(any_store, wid, Rank(3, 1), WorkItemState.running, "run_agent#1")
    assert late.stale and not late.closed and late.current == Rank(4, 1)
    row = await any_store.get_work_item(wid)
    assert row is not None and (row.state, row.fence_rank) == ("awaiting_review", Rank(4, 1).encode())
    [rejected] = [e for e in await any_store.list_events(wid) if e.type == "stale_write_rejected"]
    assert rejected.data["presented"] == {"step": 3, "attempt": 1}
    assert rejected.data["current"] == {"step": 4, "attempt": 1} and rejected.data["writer"] == "run_agent#1"


async def test_an_older_attempt_of_the_same_step_loses_once_a_newer_one_has_written(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    assert (await _state(any_store, wid, Rank(2, 1), WorkItemState.running, "run_agent#1")).ok
    assert (await _state(any_store, wid, Rank(2, 2), WorkItemState.running, "run_agent#2")).ok
    done = await any_store.fenced_event(
        rank=Rank(2, 1), work_item_id=wid, tenant_id=tid, writer="run_agent#1", type_="agent_finished", data={}
    )
    assert done.stale
    ok = await any_store.fenced_event(
        rank=Rank(2, 2), work_item_id=wid, tenant_id=tid, writer="run_agent#2", type_="agent_finished", data={}
    )
    assert ok.ok
    finished = [e for e in await any_store.list_events(wid) if e.type == "agent_finished"]
    assert [Rank.decode(e.rank or 0) for e in finished] == [Rank(2, 2)]


async def test_equal_ranks_are_one_scheduled_attempt_and_both_copies_are_accepted(any_store: Store) -> None:
    """A local activity re-run after its workflow task moved to another worker presents the same rank with the same
    input: accepting it again must not fail, and must not lower anything."""
    _tid, wid = await _item(any_store)
    for _ in range(2):
        assert (await _state(any_store, wid, Rank(5, 1), WorkItemState.running, "set_state#1")).ok
    row = await any_store.get_work_item(wid)
    assert row is not None and row.fence_rank == Rank(5, 1).encode()


async def test_a_terminal_item_refuses_every_later_write_even_a_higher_ranked_one(any_store: Store) -> None:
    _tid, wid = await _item(any_store)
    assert (
        await _state(any_store, wid, Rank(7, 1), WorkItemState.succeeded, "finish#1", fields={"result": {"by": "w"}})
    ).ok
    late = await _state(any_store, wid, Rank(9, 1), WorkItemState.running, "run_agent#1")
    assert late.closed and late.state == "succeeded"
    row = await any_store.get_work_item(wid)
    assert row is not None and (row.state, row.result, row.result_rank) == ("succeeded", {"by": "w"}, 7_000_001)
    assert "write_after_terminal_rejected" in [e.type for e in await any_store.list_events(wid)]


async def test_a_stale_attempt_record_changes_nothing(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    newer = AttemptRecord(number=1, verdict="passed", reason="new", agent={"n": 2})
    older = AttemptRecord(number=1, verdict="failed", reason="old", agent={"n": 1})
    assert (
        await any_store.record_attempt(work_item_id=wid, tenant_id=tid, rank=Rank(4, 1), record=newer, writer="w2")
    ).ok
    assert (
        await any_store.record_attempt(work_item_id=wid, tenant_id=tid, rank=Rank(3, 1), record=older, writer="w1")
    ).stale
    [attempt] = await any_store.list_attempts(wid)
    assert (attempt.verdict, attempt.rank, attempt.agent) == ("passed", Rank(4, 1).encode(), {"n": 2})


async def test_a_result_and_its_attempt_record_are_one_write_at_one_rank(any_store: Store, tmp_path: Any) -> None:
    tid, wid = await _item(any_store)
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


async def test_admission_moves_only_a_waiting_item_and_reports_a_closed_or_missing_one(
    any_store: Store, tmp_path: Any
) -> None:
    tid, wid = await _item(any_store, tenant="admission")
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path)))
    spec = WorkItemSpec.model_validate(TASK)
    first = await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=1, spec=spec))
    assert first.admitted and first.past_fingerprints == [] and first.budget is not None
    assert first.review_timeout_s == Settings(data_dir=tmp_path).max_review_timeout_s_ceiling
    await _state(any_store, wid, Rank(2, 1), WorkItemState.running, "r")
    again = await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=3, spec=spec))  # continued run
    assert again.admitted and (await any_store.get_work_item(wid)).state == "running"  # type: ignore[union-attr]
    await _state(any_store, wid, Rank(4, 1), WorkItemState.failed, "f")
    closed = await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=5, spec=spec))
    assert not closed.admitted and closed.reason == "already failed"
    from temporalio.exceptions import ApplicationError

    with pytest.raises(ApplicationError) as err:
        await control.admit(AdmitInput(work_item_id="wi_nope", tenant_id=tid, step=1, spec=spec))
    assert err.value.type == "BadInput"
    admitted = [e for e in await any_store.list_events(wid) if e.data.get("state") == "admitted"]
    assert len(admitted) == 1


async def test_operator_ceilings_apply_where_the_submission_set_none(any_store: Store, tmp_path: Any) -> None:
    tid, wid = await _item(any_store, tenant="ceilings")
    settings = Settings(data_dir=tmp_path, max_tokens_ceiling=1234, max_wall_clock_s_ceiling=99.0)
    control = bound(Ports.build(any_store, settings))
    res = await control.admit(
        AdmitInput(work_item_id=wid, tenant_id=tid, step=1, spec=WorkItemSpec.model_validate(TASK))
    )
    assert res.budget is not None and (res.budget.max_tokens, res.budget.max_wall_clock_s) == (1234, 99.0)
    tid2, wid2 = await _item(any_store, tenant="ceilings", budget={"max_tokens": 10**6})
    over = await control.admit(
        AdmitInput(
            work_item_id=wid2,
            tenant_id=tid2,
            step=1,
            spec=WorkItemSpec.model_validate({**TASK, "budget": {"max_tokens": 10**6}}),
        )
    )
    assert not over.admitted and "max_tokens" in over.reason


async def test_the_tenant_in_flight_limit_queues_later_items_first_come_first_served(
    any_store: Store, tmp_path: Any
) -> None:
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path, tenant_max_in_flight=2)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [await _item(any_store, tenant="flood") for _ in range(4)]
    other = await _item(any_store, tenant="quiet")

    async def admit(item: tuple[str, str], step: int) -> Any:
        return await control.admit(AdmitInput(work_item_id=item[1], tenant_id=item[0], step=step, spec=spec))

    got = [await admit(i, 1) for i in items]
    assert [g.admitted for g in got] == [True, True, False, False]
    assert [g.queued_position for g in got[2:]] == [1, 2]
    assert [(await any_store.get_work_item(i[1])).state for i in items[2:]] == ["queued", "queued"]  # type: ignore[union-attr]
    assert (await admit(other, 1)).admitted, "another tenant's item is not held back by this tenant's limit"
    # The fourth cannot jump the third when a place frees: first come, first served.
    await _state(any_store, items[0][1], Rank(2, 1), WorkItemState.succeeded, "finish#1")
    assert not (await admit(items[3], 2)).admitted
    assert (await admit(items[2], 2)).admitted
    queued = [e for e in await any_store.list_events(items[3][1]) if e.data.get("state") == "queued"]
    assert len(queued) == 1, "waiting again does not write again"


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


async def test_a_watched_attempt_stops_itself_when_a_later_attempt_writes(any_store: Store) -> None:
    from temporalio.exceptions import ApplicationError

    tid, wid = await _item(any_store)
    me = AttemptWriter(any_store, wid, tid, Rank(2, 1), "run_agent#1")
    assert (await me.set_state(WorkItemState.running, "mine")).ok
    with pytest.raises(ApplicationError) as err:
        async with watch(me, every_s=0.05):
            await _state(any_store, wid, Rank(2, 2), WorkItemState.running, "run_agent#2")
            await asyncio.sleep(5)  # the work: cancelled by the watch long before this ends
    assert err.value.type == "StaleAttempt" and "stale" in str(err.value)
    assert await me.superseded() is not None


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
    from crewwork.masking import mask_secrets

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
        tid, wid = await _item(store)
        async with store.session() as s:  # make sure a pooled connection exists, and learn its backend
            conn = await s.connection()
            pid = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
        admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        res = await store.set_state(
            work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), state=WorkItemState.running, writer="after-kill"
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
        _tid, wid = await _item(store)
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
        _tid, wid = await _item(store)
        ranks = [Rank(step, attempt) for step in range(1, 9) for attempt in (1, 2, 3)]
        import random

        random.Random(7).shuffle(ranks)
        await asyncio.gather(*(_state(store, wid, r, WorkItemState.running, f"w{r}") for r in ranks))
        accepted = [Rank.decode(e.rank or 0) for e in await store.list_events(wid) if e.type == "state_changed"]
        assert accepted == sorted(accepted) and accepted[-1] == Rank(8, 3)
        row = await store.get_work_item(wid)
        assert row is not None and row.fence_rank == Rank(8, 3).encode()
    finally:
        await store.close()


async def _finish(control: Any, item: tuple[str, str], step: int) -> Any:
    tid, wid = item
    result = WorkItemResult(work_item_id=wid, state=WorkItemState.succeeded, reason="done")
    return await control.finish(FinishInput(work_item_id=wid, tenant_id=tid, step=step, result=result))


async def test_an_ending_item_hands_its_place_to_the_first_queued_item_in_its_own_write(
    any_store: Store, tmp_path: Any
) -> None:
    """The place goes to the oldest queued item in the ending item's transaction, at the queued item's own mark: it
    needs no second admission, and the queue stays first come, first served."""
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [await _item(any_store, tenant="handoff") for _ in range(3)]
    got = [await control.admit(AdmitInput(work_item_id=w, tenant_id=t, step=1, spec=spec)) for t, w in items]
    assert [g.admitted for g in got] == [True, False, False]
    assert all(g.budget is not None for g in got), "a queued item learns the terms it will run under"
    marks = {w: (await any_store.get_work_item(w)).fence_rank for _t, w in items}  # type: ignore[union-attr]

    assert (await _finish(control, items[0], 2)).ok
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
    items = [await _item(any_store, tenant="keeps") for _ in range(3)]
    for t, w in items:
        await control.admit(AdmitInput(work_item_id=w, tenant_id=t, step=1, spec=spec))
    # running -> validating: still in flight.
    await control.set_state(
        SetStateInput(work_item_id=items[0][1], tenant_id=items[0][0], step=2, state=WorkItemState.validating)
    )
    # A queued item cancelled: it held no place.
    await _finish(control, items[2], 2)
    assert [(await any_store.get_work_item(w)).state for _t, w in items] == [  # type: ignore[union-attr]
        "validating",
        "queued",
        "succeeded",
    ]
    # A stale finish of the admitted item is refused, and refused writes hand nothing on either.
    await control.set_state(
        SetStateInput(work_item_id=items[0][1], tenant_id=items[0][0], step=5, state=WorkItemState.running)
    )
    stale = await _finish(control, items[0], 4)
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
        items = [await _item(store, tenant="race") for _ in range(40)]
        tid = items[0][0]
        steps = dict.fromkeys((w for _t, w in items), 1)
        order: list[str] = []

        async def admit(wid: str) -> None:
            steps[wid] += 1
            await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=steps[wid], spec=spec))

        async def finish(wid: str) -> None:
            steps[wid] += 1
            assert (await _finish(control, (tid, wid), steps[wid])).ok

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


@pytest.mark.postgres
async def test_the_autocommit_submission_leaves_its_pooled_connection_transactional(pg_url: str) -> None:
    """The submission runs as one statement outside a transaction (AUTOCOMMIT on its connection). The pool must hand
    that connection back transactional: a fenced write's lock and change on an autocommit connection would each
    commit on their own."""
    from sqlalchemy import text

    store = Store(pg_url, pool_size=1)
    try:
        tid, _wid = await _item(store)
        async with store.session() as s:
            first = (await s.execute(text("SELECT txid_current()"))).scalar()
            second = (await s.execute(text("SELECT txid_current()"))).scalar()
        assert first == second, "two statements of one session ran in two transactions"
        assert tid
    finally:
        await store.close()
