"""Attacks on the one-statement writes (PostgreSQL: a state change, attempt record or evidence event and its event
in one data-modifying CTE; the submission in one autocommit statement): the row and its event commit together or
not at all, nothing of one item or tenant is baked into a cached statement, events keep their order, concurrent
identical submissions make one item, and a fresh submission is stored as the ORM stored it."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, NoResultFound, StatementError

from crewwork.config import Settings
from crewwork.models import WorkItemResult, WorkItemSpec, WorkItemState
from crewwork.steps.admit import AdmitInput
from crewwork.steps.finish import FinishInput
from crewwork.steps.ports import Ports
from crewwork.steps.record import RecordInput
from crewwork.steps.registry import bound
from crewwork.store.artifacts import new_artifact
from crewwork.store.fencing import Accepted, FencedWrite, StateChange
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import AttemptRecord, Rank, Store
from crewwork.store.tables import Event
from tests.invariants import check_invariants

TASK = {"kind": "task", "input": {}}


async def _item(store: Store, tenant: str, **spec: Any) -> tuple[str, str]:
    tid = await store.ensure_tenant(tenant)
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate({**TASK, **spec}), base_commit=None, repo_path=None
    )
    return tid, row.id


async def _raw(store: Store, sql: str, **params: Any) -> list[Any]:
    async with store.engine.connect() as c:
        return list((await c.execute(text(sql), params)).all())


async def _events(store: Store, wid: str) -> list[tuple[int, str, str]]:
    """(id, type, tenant) of the item's events, in id order."""
    rows = await _raw(store, "SELECT id, type, tenant_id FROM events WHERE work_item_id = :w ORDER BY id", w=wid)
    return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


async def test_a_fresh_submission_stores_no_result(any_store: Store) -> None:
    """The ORM insert left `result` out: SQL NULL. The one-statement insert bound None to the JSON column, which
    SQLAlchemy writes as the JSON value `null`: `result IS NULL` no longer found fresh items (a report, an export,
    an operator's query), and the two kinds of row differed from those inserted by the old code."""
    _tid, wid = await _item(any_store, "cte-null-result")
    [(is_null,)] = await _raw(any_store, "SELECT result IS NULL FROM work_items WHERE id = :w", w=wid)
    assert is_null
    assert (await any_store.get_work_item(wid)).result is None  # type: ignore[union-attr]


async def test_the_returned_submission_is_the_stored_row(any_store: Store) -> None:
    """What the API shows for a fresh submission (made from the values it inserted) is what a later read of it shows."""
    tid = await any_store.ensure_tenant("cte-view")
    spec = WorkItemSpec.model_validate({**TASK, "labels": {"team": "a"}, "idempotency_key": "k-view"})
    made, created = await any_store.create_work_item(
        tenant_id=tid, spec=spec, base_commit="a" * 40, repo_path="/srv/r.git", submission_hash="h" * 64
    )
    assert created
    assert made == await any_store.get_work_item(made.id)
    [(_id, kind, _t)] = await _events(any_store, made.id)
    [(ev_at, item_at)] = await _raw(
        any_store,
        "SELECT e.created_at, w.created_at FROM events e JOIN work_items w ON w.id = e.work_item_id "
        "WHERE e.work_item_id = :w",
        w=made.id,
    )
    assert kind == "submitted" and ev_at == item_at == made.created_at


async def test_concurrent_identical_submissions_make_one_item_and_one_event(pg_store: Store) -> None:
    tid = await pg_store.ensure_tenant("cte-idem")
    spec = WorkItemSpec.model_validate({**TASK, "idempotency_key": "same"})
    got = await asyncio.gather(
        *(
            pg_store.create_work_item(
                tenant_id=tid, spec=spec, base_commit=None, repo_path=None, submission_hash="s" * 64
            )
            for _ in range(16)
        )
    )
    assert len({row.id for row, _ in got}) == 1 and sum(created for _, created in got) == 1
    [(n_items,)] = await _raw(pg_store, "SELECT count(*) FROM work_items WHERE tenant_id = :t", t=tid)
    [(n_events,)] = await _raw(pg_store, "SELECT count(*) FROM events WHERE tenant_id = :t", t=tid)
    assert (n_items, n_events) == (1, 1)


async def test_a_submission_refused_by_a_constraint_leaves_no_event(pg_store: Store) -> None:
    """The autocommit statement's row fails (an over-long idempotency key): its `submitted` event must not stay."""
    tid = await pg_store.ensure_tenant("cte-refused")
    spec = WorkItemSpec.model_validate({**TASK, "idempotency_key": "refused"})
    with pytest.raises(StatementError):
        await pg_store.create_work_item(
            tenant_id=tid,
            spec=spec,
            base_commit="b" * 65,
            repo_path=None,  # base_commit is String(64)
        )
    assert await _raw(pg_store, "SELECT id FROM events WHERE tenant_id = :t", t=tid) == []
    assert await _raw(pg_store, "SELECT id FROM work_items WHERE tenant_id = :t", t=tid) == []


async def test_a_state_change_whose_event_cannot_be_written_changes_nothing(any_store: Store) -> None:
    """The change and its event are one statement on PostgreSQL: an event that cannot be written (data that does
    not serialize) must leave the row as it was, its mark unraised, and the caller must see the error."""
    tid, wid = await _item(any_store, "cte-bad-event")
    assert (
        await any_store.set_state(
            StateChange(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="t"), state=WorkItemState.admitted
            )
        )
    ).ok
    before = await _events(any_store, wid)
    with pytest.raises((TypeError, StatementError)):
        await any_store.set_state(
            StateChange(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(2, 1), writer="t"),
                state=WorkItemState.running,
                event_data={"unserializable": object()},
            )
        )
    row = await any_store.get_work_item(wid)
    assert row is not None and (row.state, row.fence_rank) == ("admitted", Rank(1, 1).encode())
    assert await _events(any_store, wid) == before


async def test_an_evidence_event_that_cannot_be_written_leaves_no_artifact(pg_store: Store) -> None:
    """An evidence event with one artifact is one statement: an over-long event type (events.type is 64
    characters) fails both, and the mark stays where it was. (The server-side write is sent on the driver: its
    error is the driver's, `Database.driver_scalar`.)"""
    tid, wid = await _item(pg_store, "cte-bad-evidence")
    art = new_artifact(
        work_item_id=wid, tenant_id=tid, name="transcript", data=b"hello", content_type="text/plain", max_bytes=100
    )
    with pytest.raises((StatementError, asyncpg.exceptions.StringDataRightTruncationError)):
        await pg_store.fenced_event(
            FencedWrite(rank=Rank(3, 1), work_item_id=wid, tenant_id=tid, writer="t"),
            type_="t" * 65,
            data={},
            artifacts=[art],
        )
    assert await _raw(pg_store, "SELECT id FROM artifacts WHERE work_item_id = :w", w=wid) == []
    assert [t for _i, t, _ in await _events(pg_store, wid)] == ["submitted"]
    row = await pg_store.get_work_item(wid)
    assert row is not None and row.fence_rank == 0
    ok = await pg_store.fenced_event(
        FencedWrite(rank=Rank(3, 1), work_item_id=wid, tenant_id=tid, writer="t"),
        type_="evidence",
        data={},
        artifacts=[art],
    )
    assert ok.ok
    assert len(await _raw(pg_store, "SELECT id FROM artifacts WHERE work_item_id = :w", w=wid)) == 1
    assert [t for _i, t, _ in await _events(pg_store, wid)] == ["submitted", "evidence"]


async def test_the_cached_update_binds_the_item_the_tenant_and_every_value(any_store: Store) -> None:
    """Two items of two tenants changed through the same cached statement (the same columns, given in another
    order): each change lands on its own row, its event names its own item and tenant, and only the tenant that has
    a webhook gets a notification (the webhook lookup's tenant is bound, not captured)."""
    ta, a = await _item(any_store, "cte-cache-a")
    tb, b = await _item(any_store, "cte-cache-b")
    await OutboxStore(any_store).create_webhook(tb, "http://127.0.0.1:9/hook", [])
    for wid, tid in ((a, ta), (b, tb)):
        assert (
            await any_store.set_state(
                StateChange(
                    FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="t"),
                    state=WorkItemState.admitted,
                )
            )
        ).ok
    ok_a = await any_store.set_state(
        StateChange(
            FencedWrite(work_item_id=a, tenant_id=ta, rank=Rank(5, 1), writer="wa"),
            state=WorkItemState.landing,
            fields={"delivery_branch": "br-a", "landed_commit": "c" * 40},
        )
    )
    ok_b = await any_store.set_state(
        StateChange(
            FencedWrite(work_item_id=b, tenant_id=tb, rank=Rank(7, 2), writer="wb"),
            state=WorkItemState.validating,
            reason="rb",
            fields={"landed_commit": "d" * 40, "delivery_branch": "br-b"},
        )
    )
    assert ok_a.ok and ok_b.ok
    ra, rb = await any_store.get_work_item(a), await any_store.get_work_item(b)
    assert ra is not None and rb is not None
    assert (ra.state, ra.delivery_branch, ra.landed_commit, ra.fence_rank, ra.state_rank) == (
        "landing",
        "br-a",
        "c" * 40,
        Rank(5, 1).encode(),
        Rank(5, 1).encode(),
    )
    assert (rb.state, rb.reason, rb.delivery_branch, rb.landed_commit, rb.fence_rank) == (
        "validating",
        "rb",
        "br-b",
        "d" * 40,
        Rank(7, 2).encode(),
    )
    assert {t for _i, _ty, t in await _events(any_store, a)} == {ta}
    assert {t for _i, _ty, t in await _events(any_store, b)} == {tb}
    # (The database is shared with the session's other tests: only these two items' notifications are looked at.)
    outbox = await _raw(
        any_store, "SELECT work_item_id FROM outbox WHERE work_item_id IN (:a, :b) ORDER BY id", a=a, b=b
    )
    assert {r[0] for r in outbox} <= {b} and (b,) in [tuple(r) for r in outbox]


async def test_a_finish_appends_its_attempt_its_change_and_the_hand_offs_in_that_order(
    any_store: Store, tmp_path: Any
) -> None:
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate(TASK)
    (tid, first), (_, second) = await _item(any_store, "cte-order"), await _item(any_store, "cte-order")
    assert (await control.admit(AdmitInput(work_item_id=first, tenant_id=tid, step=1, spec=spec))).admitted
    assert not (await control.admit(AdmitInput(work_item_id=second, tenant_id=tid, step=1, spec=spec))).admitted
    record = RecordInput(work_item_id=first, tenant_id=tid, step=2, attempt=1, verdict="passed", reason="output")
    result = WorkItemResult(work_item_id=first, state=WorkItemState.succeeded, reason="done")
    assert (
        await control.finish(FinishInput(work_item_id=first, tenant_id=tid, step=2, result=result, record=record))
    ).ok
    mine = [(i, t) for i, t, _ in await _events(any_store, first)]
    handed = [(i, t) for i, t, _ in await _events(any_store, second)]
    assert [t for _i, t in mine][-2:] == ["attempt_recorded", "state_changed"]
    assert handed[-1][1] == "state_changed"
    assert mine[-2][0] < mine[-1][0] < handed[-1][0]
    row = await any_store.get_work_item(first)
    assert row is not None and (row.state, row.attempt_count) == ("succeeded", 1)
    assert (await any_store.get_work_item(second)).state == "admitted"  # type: ignore[union-attr]


@pytest.mark.parametrize("server", [True, False])
async def test_a_webhook_registered_inside_the_write_before_its_change_gets_that_change(
    pg_store: Store, server: bool
) -> None:
    """The write holds its item row and is inserting a task's attempt record (held there by a trigger that waits
    for an advisory lock another connection holds) when a webhook is registered: the change's UPDATE comes after,
    and its webhook lookup (in that UPDATE's RETURNING on the Python path, the outbox statement on the server path)
    must see the webhook."""
    pg_store.server_writes = server
    tid, wid = await _item(pg_store, f"cte-hook-before-{server}")
    assert (
        await pg_store.set_state(
            StateChange(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="t"), state=WorkItemState.admitted
            )
        )
    ).ok
    key, name = random.randrange(1, 2**31), f"pause_{wid.lower()}"
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        await holder.execute(
            text(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN PERFORM pg_advisory_xact_lock({key}); RETURN NEW; END $$"
            )
        )
        await holder.execute(
            text(
                f"CREATE TRIGGER {name} BEFORE INSERT ON attempts FOR EACH ROW "
                f"WHEN (NEW.work_item_id = '{wid}') EXECUTE FUNCTION {name}()"
            )
        )
        await holder.commit()
        try:
            write = asyncio.create_task(
                pg_store.set_state(
                    StateChange(
                        FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(2, 1), writer="finish#1"),
                        state=WorkItemState.succeeded,
                        fields={"result": {"state": "succeeded"}},
                        attempt=AttemptRecord(number=1, verdict="passed", reason="ok"),
                    )
                )
            )
            for _ in range(500):  # until the write waits inside, on the advisory lock
                waiting = await _raw(
                    pg_store, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = :k AND NOT granted", k=key
                )
                if waiting:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the write never reached its attempt record")
            await OutboxStore(pg_store).create_webhook(tid, "http://127.0.0.1:9/hook", [])
            await holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            await holder.commit()
            assert (await asyncio.wait_for(write, 10)).ok
        finally:
            await holder.execute(text(f"DROP TRIGGER IF EXISTS {name} ON attempts"))
            await holder.execute(text(f"DROP FUNCTION IF EXISTS {name}()"))
            await holder.commit()
    rows = await _raw(pg_store, "SELECT payload FROM outbox WHERE work_item_id = :w", w=wid)
    assert [r[0]["state"] for r in rows] == ["succeeded"]
    assert [t for _i, t, _ in await _events(pg_store, wid)][-2:] == ["attempt_recorded", "state_changed"]


async def test_zombie_writes_through_the_one_statement_paths_leave_nothing_and_the_checker_sees_a_forged_one(
    pg_store: Store,
) -> None:
    """Late attempts write through each one-statement path (an attempt record, an evidence event with its one
    artifact, a state change with a result): each is refused, leaves no row, artifact or accepted event, and the
    invariant checker passes; an accepted write forged below the mark afterwards is caught."""
    tid, wid = await _item(pg_store, "cte-zombie")
    w: dict[str, Any] = {"work_item_id": wid, "tenant_id": tid}
    assert (
        await pg_store.set_state(
            StateChange(FencedWrite(**w, rank=Rank(1, 1), writer="admit#1"), state=WorkItemState.admitted)
        )
    ).ok
    assert (
        await pg_store.set_state(
            StateChange(FencedWrite(**w, rank=Rank(2, 2), writer="run#2"), state=WorkItemState.running)
        )
    ).ok
    good = AttemptRecord(number=1, verdict="passed", reason="ok")
    assert (await pg_store.record_attempt(FencedWrite(**w, rank=Rank(3, 1), writer="record#1"), record=good)).ok
    art = new_artifact(
        work_item_id=wid, tenant_id=tid, name="transcript", data=b"zombie", content_type="text/plain", max_bytes=100
    )
    zombie = AttemptRecord(number=1, verdict="failed", reason="zombie", cause="agent")
    assert (await pg_store.record_attempt(FencedWrite(**w, rank=Rank(2, 1), writer="record#0"), record=zombie)).stale
    assert (
        await pg_store.fenced_event(
            FencedWrite(**w, rank=Rank(2, 1), writer="run#1"), type_="agent_finished", data={}, artifacts=[art]
        )
    ).stale
    assert (
        await pg_store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(2, 1), writer="run#1"),
                state=WorkItemState.failed,
                fields={"result": {"state": "failed"}},
            )
        )
    ).stale
    assert (
        await pg_store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(5, 1), writer="finish#1"),
                state=WorkItemState.succeeded,
                fields={"result": {"ok": 1}},
            )
        )
    ).ok
    late = AttemptRecord(number=2, verdict="failed", reason="late")
    assert (await pg_store.record_attempt(FencedWrite(**w, rank=Rank(9, 1), writer="record#9"), record=late)).closed
    assert await _raw(pg_store, "SELECT id FROM artifacts WHERE work_item_id = :w", w=wid) == []
    [attempt] = await pg_store.list_attempts(wid)
    assert (attempt.verdict, attempt.rank) == ("passed", Rank(3, 1).encode())
    row = await pg_store.get_work_item(wid)
    assert row is not None and (row.state, row.result, row.attempt_count) == ("succeeded", {"ok": 1}, 1)
    report = await check_invariants(pg_store, [wid], check_git=False)
    report.assert_ok()
    assert report.counts["stale_rejected"] == 3 and report.counts["after_terminal_rejected"] == 1
    # A zombie's accepted change, forged by hand (what a store without fencing would have let through).
    async with pg_store.session() as s:
        s.add(
            Event(
                work_item_id=wid,
                tenant_id=tid,
                type="state_changed",
                data={"state": "failed", "reason": "", "writer": "run#1"},
                rank=Rank(2, 1).encode(),
                created_at=1.0,
            )
        )
    assert "monotonic_writes" in (await check_invariants(pg_store, [wid], check_git=False)).failed()


async def test_a_state_change_of_a_row_that_is_not_there_commits_no_event(any_store: Store) -> None:
    """Events have no foreign key, and on PostgreSQL the event's INSERT runs whether or not the UPDATE beside it
    matched a row: an UPDATE that matched none (the row gone) must fail the write, so the event is not committed
    alone."""
    tid, wid = await _item(any_store, "cte-no-row")
    ghost = "wi_ghost_" + wid[-8:]

    async def body(s: Any, started: Any) -> None:
        started()
        acc = Accepted(now=1.0, rank=Rank(4, 1))
        ghost_write = FencedWrite(ghost, tid, acc.rank, "zombie")
        await any_store.writes.change_state(s, acc, StateChange(ghost_write, WorkItemState.running, "x"))

    with pytest.raises(NoResultFound):
        await any_store.transaction(body)
    assert await _events(any_store, ghost) == []


async def test_a_submission_refused_by_a_foreign_key_leaves_no_event(pg_store: Store) -> None:
    """An IntegrityError inside the autocommit statement (the tenant is gone): the caller sees it, and neither the
    row nor its `submitted` event stays."""
    spec = WorkItemSpec.model_validate({**TASK, "idempotency_key": "gone"})
    with pytest.raises(IntegrityError):
        await pg_store.create_work_item(tenant_id="tn_gone", spec=spec, base_commit=None, repo_path=None)
    assert await _raw(pg_store, "SELECT id FROM events WHERE tenant_id = 'tn_gone'") == []
    assert await _raw(pg_store, "SELECT id FROM work_items WHERE tenant_id = 'tn_gone'") == []


async def test_racing_writers_leave_one_event_per_accepted_change_in_rank_order(pg_store: Store) -> None:
    """Twenty-four attempts of one item write at once, in a shuffled order, through the one-statement change (half
    with a result: the same cached statement for other columns): each accepted write left exactly its
    `state_changed` event, each refused one its rejection, the accepted events rise in rank with their ids, and the
    row carries the highest rank, its state and its result."""
    tid, wid = await _item(pg_store, "cte-race")
    ranks = [Rank(step, attempt) for step in range(1, 9) for attempt in (1, 2, 3)]
    order = ranks[:]
    random.Random(7).shuffle(order)

    async def write(r: Rank) -> tuple[Rank, bool]:
        fields = {"result": {"rank": r.encode()}} if r.attempt == 2 else None
        out = await pg_store.set_state(
            StateChange(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=r, writer=f"w{r.encode()}"),
                state=WorkItemState.running,
                reason=f"r{r.encode()}",
                fields=fields,
            )
        )
        return r, out.ok

    got = await asyncio.gather(*(write(r) for r in order))
    accepted = sorted(r.encode() for r, ok in got if ok)
    refused = sorted(r.encode() for r, ok in got if not ok)
    rows = await _raw(pg_store, "SELECT id, type, rank, data FROM events WHERE work_item_id = :w ORDER BY id", w=wid)
    changed = [(int(r[0]), int(r[2]), r[3]) for r in rows if r[1] == "state_changed"]
    rejected = sorted(int(r[2]) for r in rows if r[1] == "stale_write_rejected")
    assert sorted(rk for _i, rk, _d in changed) == accepted and rejected == refused
    assert [rk for _i, rk, _d in changed] == accepted, "accepted changes committed out of rank order"
    assert all(d["writer"] == f"w{rk}" and d["reason"] == f"r{rk}" for _i, rk, d in changed)
    row = await pg_store.get_work_item(wid)
    assert row is not None and row.fence_rank == row.state_rank == accepted[-1]
    assert row.reason == f"r{accepted[-1]}"
    with_result = [rk for rk in accepted if Rank.decode(rk).attempt == 2]
    if with_result:
        assert row.result == {"rank": with_result[-1]} and row.result_rank == with_result[-1]
    assert Rank(8, 3).encode() in accepted


async def test_a_hand_off_of_several_items_in_one_transaction_changes_each_its_own_row(
    any_store: Store, tmp_path: Any
) -> None:
    """One ending item hands three places on in its transaction: three changes through the same cached statement,
    one after another. Each handed item is admitted with its own event (its id, its tenant), in queue order after
    the ending item's own change, and nothing else of the tenant moved."""
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [await _item(any_store, "cte-handoff-many") for _ in range(5)]
    tid = items[0][0]
    got = [await control.admit(AdmitInput(work_item_id=w, tenant_id=tid, step=1, spec=spec)) for _t, w in items]
    assert [g.admitted for g in got] == [True, False, False, False, False]
    first, queued = items[0][1], [w for _t, w in items[1:]]
    out = await any_store.set_state(
        StateChange(
            FencedWrite(work_item_id=first, tenant_id=tid, rank=Rank(2, 1), writer="finish#1"),
            state=WorkItemState.succeeded,
            fields={"result": {"state": "succeeded"}},
            max_in_flight=3,
            hand_off_cap=3,
        )
    )
    assert out.ok and [h.work_item_id for h in out.value or []] == queued[:3]
    states = [(await any_store.get_work_item(w)).state for w in queued]  # type: ignore[union-attr]
    assert states == ["admitted", "admitted", "admitted", "queued"]
    [(own_id, _t, _tn)] = [e for e in await _events(any_store, first) if e[1] == "state_changed"][-1:]
    last_ids = []
    for w in queued[:3]:
        evs = await _events(any_store, w)
        assert evs[-1][1:] == ("state_changed", tid)
        last_ids.append(evs[-1][0])
        [(data,)] = await _raw(any_store, "SELECT data FROM events WHERE id = :i", i=evs[-1][0])
        assert (data if isinstance(data, dict) else json.loads(data))["state"] == "admitted"
    assert own_id < last_ids[0] < last_ids[1] < last_ids[2]
    assert (await _events(any_store, queued[3]))[-1][1] == "state_changed"  # its own `queued`, from before
    [(n,)] = await _raw(
        any_store,
        "SELECT count(*) FROM events WHERE work_item_id = :w AND type = 'state_changed'",
        w=queued[3],
    )
    assert n == 1


async def _wait_blocked(store: Store) -> None:
    for _ in range(500):
        rows = await _raw(
            store,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        if int(rows[0][0]) >= 1:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the write never waited for the lock")


async def test_a_webhook_registered_while_an_admission_waits_for_the_tenant_lock_gets_its_change(
    pg_store: Store, tmp_path: Any
) -> None:
    """An admission holds its item row and waits for the tenant lock (another admission of the tenant has it); a
    webhook registered meanwhile precedes the admission's change, which must be announced."""
    control = bound(Ports.build(pg_store, Settings(data_dir=tmp_path, tenant_max_in_flight=2)))
    spec = WorkItemSpec.model_validate(TASK)
    tid, wid = await _item(pg_store, "cte-hook-admit")
    async with pg_store.engine.connect() as side:
        await side.execute(text("SELECT id FROM tenants WHERE id = :t FOR NO KEY UPDATE"), {"t": tid})
        admit = asyncio.create_task(control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=1, spec=spec)))
        await _wait_blocked(pg_store)
        await OutboxStore(pg_store).create_webhook(tid, "http://127.0.0.1:9/hook", [])
        await side.commit()
    assert (await asyncio.wait_for(admit, 10)).admitted
    rows = await _raw(pg_store, "SELECT payload FROM outbox WHERE work_item_id = :w", w=wid)
    assert [r[0]["state"] for r in rows] == ["admitted"]


async def test_a_row_deleted_while_a_change_waits_for_it_gets_no_event(pg_store: Store) -> None:
    """The item row is deleted (an operator's purge, its tenant's cascade) while a change waits for its lock: the
    write finds it missing and appends nothing, though events have no foreign key to stop an orphan."""
    tid, wid = await _item(pg_store, "cte-deleted")
    async with pg_store.engine.connect() as side:
        await side.execute(text("DELETE FROM work_items WHERE id = :w"), {"w": wid})
        write = asyncio.create_task(
            pg_store.set_state(
                StateChange(
                    FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="t"),
                    state=WorkItemState.admitted,
                )
            )
        )
        await _wait_blocked(pg_store)
        await side.commit()
    out = await asyncio.wait_for(write, 10)
    assert not out.ok and out.missing
    assert [t for _i, t, _ in await _events(pg_store, wid)] == ["submitted"]
