"""The server-side fenced write (PostgreSQL, `crewwork_fenced_write`, migration 0008) against the Python path it
replaces: the same scenario through both leaves the same rows, events, attempt records, outbox rows and artifacts,
and returns the same results; and the server path holds under the races the Python path was attacked with (a
webhook registered while a write waits, a stale attempt waking during a write, admissions and hand-offs racing)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import text

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.artifacts import new_artifact
from crewwork.store.fencing import FencedWrite, Rank, StateChange
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import AttemptRecord, Store
from tests.invariants import check_invariants

TASK = {"kind": "task", "input": {}}
S = WorkItemState


async def _raw(store: Store, sql: str, **params: Any) -> list[Any]:
    async with store.engine.connect() as c:
        return list((await c.execute(text(sql), params)).all())


def _shape(res: Any) -> tuple[Any, ...]:
    value = res.value
    if isinstance(value, list):  # handed-off items: ids differ between runs, their number does not
        value = len(value)
    elif value is not None and hasattr(value, "admitted"):
        value = (value.admitted, value.queued_position, value.in_flight, value.fingerprints)
    return (res.ok, res.closed, res.missing, res.state, res.current, value)


async def _scenario(store: Store, tenant: str) -> tuple[list[Any], dict[str, Any]]:
    """Every kind of fenced write, accepted, stale, closed and missing, with a webhook and a queue: the results and
    everything the store holds for the tenant afterwards, with ids replaced by their order of appearance."""
    tid = await store.ensure_tenant(tenant)
    await OutboxStore(store).create_webhook(tid, "http://127.0.0.1:9/hook", [])
    ids = []
    for _ in range(3):
        row, _ = await store.create_work_item(
            tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
        )
        ids.append(row.id)
    a, _b, c = ids
    out: list[Any] = []

    async def fp(_s: Any, _w: str) -> list[str | None]:
        return await store.fingerprints(a)

    for wid in ids:  # limit 1: a is admitted, b and c queue (c twice: the second leaves it queued)
        out.append(
            _shape(
                await store.admit(
                    FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="admit#1"),
                    max_in_flight=1,
                    fingerprints=fp,
                )
            )
        )
    out.append(
        _shape(
            await store.admit(
                FencedWrite(work_item_id=c, tenant_id=tid, rank=Rank(1, 2), writer="admit#2"),
                max_in_flight=1,
                fingerprints=fp,
            )
        )
    )
    w = {"work_item_id": a, "tenant_id": tid}
    out.append(
        _shape(
            await store.set_state(
                StateChange(
                    FencedWrite(**w, rank=Rank(2, 1), writer="run_agent#1"),
                    state=S.running,
                    reason="run token=sk-abcdefghijklmnopqrstuvwx",
                    event_data={"attempt": 1},
                )
            )
        )
    )
    art = new_artifact(
        work_item_id=a, tenant_id=tid, name="transcript", data=b"hello", content_type="text/plain", max_bytes=100
    )
    out.append(
        _shape(
            await store.fenced_event(
                FencedWrite(**w, rank=Rank(2, 1), writer="run_agent#1"),
                type_="agent_finished",
                data={"attempt": 1, "transcript": art.id},
                artifacts=[art],
            )
        )
    )
    out.append(
        _shape(await store.fenced_event(FencedWrite(**w, rank=Rank(2, 1), writer="run_agent#1"), type_="note", data={}))
    )
    failed = AttemptRecord(
        number=1,
        verdict="failed",
        reason="tests failed",
        cause="test_failure",
        fingerprint="f1",
        agent={"diff_ref": {"id": "d1"}},
        validation={"exit_code": 1},
    )
    out.append(
        _shape(await store.record_attempt(FencedWrite(**w, rank=Rank(3, 1), writer="record_attempt#1"), record=failed))
    )
    # A zombie of step 2 wakes: every kind of write is refused, with its event.
    out.append(
        _shape(
            await store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="zombie"), state=S.validating))
        )
    )
    out.append(_shape(await store.fenced_event(FencedWrite(**w, rank=Rank(2, 1), writer="zombie"), type_="x", data={})))
    out.append(_shape(await store.record_attempt(FencedWrite(**w, rank=Rank(2, 1), writer="zombie"), record=failed)))
    out.append(
        _shape(
            await store.admit(
                FencedWrite(work_item_id=a, tenant_id=tid, rank=Rank(2, 1), writer="zombie"),
                max_in_flight=1,
                fingerprints=fp,
            )
        )
    )
    # A continued run's admission: not waiting, it gets the fingerprints so far.
    out.append(
        _shape(
            await store.admit(
                FencedWrite(work_item_id=a, tenant_id=tid, rank=Rank(4, 1), writer="admit#1"),
                max_in_flight=1,
                fingerprints=fp,
            )
        )
    )
    passed = AttemptRecord(number=2, verdict="passed", reason="ok", agent={"claims": "api_key=supersecretvalue123"})
    out.append(
        _shape(
            await store.set_state(
                StateChange(
                    FencedWrite(**w, rank=Rank(5, 1), writer="finish#1"),
                    state=S.succeeded,
                    reason="done",
                    fields={
                        "result": {"state": "succeeded", "output": {"n": 1}},
                        "delivery_branch": None,
                        "landed_commit": None,
                        "mock": True,
                    },
                    attempt=passed,
                    max_in_flight=1,
                    hand_off_cap=3,
                )
            )
        )
    )
    out.append(
        _shape(await store.set_state(StateChange(FencedWrite(**w, rank=Rank(6, 1), writer="late"), state=S.failed)))
    )  # closed
    out.append(
        _shape(
            await store.set_state(
                StateChange(
                    FencedWrite(work_item_id="wi_missing", tenant_id=tid, rank=Rank(1, 1), writer="x"), state=S.running
                )
            )
        )
    )
    # b was handed a's place; cancelling c (queued) leaves the queue and hands on nothing (no place is free).
    out.append(
        _shape(
            await store.set_state(
                StateChange(
                    FencedWrite(work_item_id=c, tenant_id=tid, rank=Rank(2, 1), writer="finish#1"),
                    state=S.cancelled,
                    reason="cancelled by request",
                    max_in_flight=1,
                    hand_off_cap=3,
                )
            )
        )
    )
    order = {wid: f"item{n}" for n, wid in enumerate(ids)}

    def norm(v: Any) -> Any:
        if isinstance(v, str):
            for wid, name in order.items():
                v = v.replace(wid, name)
            return v.replace(art.id, "art")
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items() if k not in ("occurred_at",)}
        if isinstance(v, list | tuple):
            return [norm(x) for x in v]
        return v

    q = {"t": tid}
    rows = {
        "items": await _raw(
            store,
            "SELECT id, state, reason, result::text, fence_rank, state_rank, result_rank, "
            "attempt_count, delivery_branch, landed_commit, mock FROM work_items "
            "WHERE tenant_id = :t ORDER BY created_at, id",
            **q,
        ),
        "events": await _raw(
            store, "SELECT work_item_id, type, data::jsonb, rank FROM events WHERE tenant_id = :t ORDER BY id", **q
        ),
        "attempts": await _raw(
            store,
            "SELECT a.work_item_id, a.number, a.rank, a.verdict, a.reason, a.cause, a.fingerprint, "
            "a.agent::jsonb, a.validation::jsonb FROM attempts a JOIN work_items w "
            "ON w.id = a.work_item_id WHERE w.tenant_id = :t ORDER BY a.id",
            **q,
        ),
        "outbox": await _raw(
            store,
            "SELECT work_item_id, event_type, payload::jsonb, status, attempts FROM outbox "
            "WHERE tenant_id = :t ORDER BY id",
            **q,
        ),
        "artifacts": await _raw(
            store,
            "SELECT id, work_item_id, name, content_type, size, sha256, content FROM "
            "artifacts WHERE tenant_id = :t ORDER BY id",
            **q,
        ),
    }
    # `result` as text: the Python path stores the ORM's JSON text, the server path jsonb's; compare as values.

    rows["items"] = [(*r[:3], json.loads(r[3]) if r[3] else None, *r[4:]) for r in rows["items"]]
    return norm(out), {k: norm([list(r) for r in v]) for k, v in rows.items()}


async def test_the_server_path_leaves_exactly_what_the_python_path_leaves(pg_store: Store) -> None:
    assert pg_store.server_writes, "PostgreSQL runs the server-side fenced write by default"
    server = await _scenario(pg_store, "server-path-diff-a")
    pg_store.server_writes = False
    python = await _scenario(pg_store, "server-path-diff-b")
    assert server[0] == python[0]
    for table in server[1]:
        assert server[1][table] == python[1][table], table
    # The scenario is not vacuous: it refused, queued, handed off, masked and notified.
    _results, tables = server
    types = [e[1] for e in tables["events"]]
    assert {"stale_write_rejected", "write_after_terminal_rejected", "attempt_recorded"} <= set(types)
    assert [r[1] for r in tables["items"]] == ["succeeded", "admitted", "cancelled"]
    assert len(tables["outbox"]) == sum(t == "state_changed" for t in types) > 0
    assert "sk-abcdefghijklmnopqrstuvwx" not in str(tables["events"]) + str(tables["outbox"])
    assert "supersecretvalue123" not in str(tables["attempts"])


async def test_a_webhook_registered_while_a_server_write_waits_for_the_row_gets_the_change(pg_store: Store) -> None:
    """The write waits for the item's row (held by another transaction) while a webhook is registered and
    committed: the change, made after the wait, is announced to it."""
    tid = await pg_store.ensure_tenant("server-hook-wait")
    row, _ = await pg_store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
    )
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM work_items WHERE id = :w FOR UPDATE"), {"w": row.id})
        write = asyncio.create_task(
            pg_store.set_state(
                StateChange(
                    FencedWrite(work_item_id=row.id, tenant_id=tid, rank=Rank(1, 1), writer="t"), state=S.admitted
                )
            )
        )
        await asyncio.sleep(0.3)
        assert not write.done()
        await OutboxStore(pg_store).create_webhook(tid, "http://127.0.0.1:9/hook", [])
        await holder.rollback()
    assert (await asyncio.wait_for(write, 10)).ok
    rows = await _raw(pg_store, "SELECT payload FROM outbox WHERE work_item_id = :w", w=row.id)
    assert [r[0]["state"] for r in rows] == ["admitted"]


async def test_a_stale_attempt_waking_during_a_server_write_is_refused_after_it(pg_store: Store) -> None:
    """A later attempt's write holds the row; the older attempt's write waits, then is refused against the new
    mark, whichever way the waits resolve."""
    tid = await pg_store.ensure_tenant("server-stale-wait")
    row, _ = await pg_store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
    )
    w = {"work_item_id": row.id, "tenant_id": tid}
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM work_items WHERE id = :w FOR UPDATE"), {"w": row.id})
        new = asyncio.create_task(
            pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 2), writer="new"), state=S.running))
        )
        await asyncio.sleep(0.2)
        old = asyncio.create_task(
            pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="old"), state=S.running))
        )
        await asyncio.sleep(0.2)
        await holder.rollback()
    assert (await asyncio.wait_for(new, 10)).ok
    late = await asyncio.wait_for(old, 10)
    assert late.stale and late.current == Rank(2, 2)
    report = await check_invariants(pg_store, work_item_ids=[row.id], require_terminal=False)
    assert report.ok, report


@pytest.mark.parametrize("limit", [1, 3])
async def test_racing_server_admissions_and_finishes_never_exceed_the_tenant_limit(pg_store: Store, limit: int) -> None:
    """Twenty items admit at once and each ends as soon as it runs, handing its place on: at no point are more
    than `limit` in flight, and every item is admitted exactly once (by itself or by a hand-off)."""
    tid = await pg_store.ensure_tenant(f"server-race-{limit}")
    ids = []
    for _ in range(20):
        row, _ = await pg_store.create_work_item(
            tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
        )
        ids.append(row.id)
    peak = 0

    async def count() -> int:
        rows = await _raw(
            pg_store,
            "SELECT count(*) FROM work_items WHERE tenant_id = :t AND state IN "
            "('admitted','running','validating','landing')",
            t=tid,
        )
        return int(rows[0][0])

    async def no_fp(_s: Any, _w: str) -> list[str | None]:
        return []

    admitted: asyncio.Queue[str] = asyncio.Queue()

    async def admit(wid: str) -> None:
        res = await pg_store.admit(
            FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="admit#1"),
            max_in_flight=limit,
            fingerprints=no_fp,
        )
        assert res.ok and res.value is not None
        if res.value.admitted:
            await admitted.put(wid)

    async def finisher() -> None:
        nonlocal peak
        done = 0
        while done < len(ids):
            wid = await asyncio.wait_for(admitted.get(), 20)
            peak = max(peak, await count())
            res = await pg_store.set_state(
                StateChange(
                    FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(2, 1), writer="finish#1"),
                    state=S.succeeded,
                    max_in_flight=limit,
                    hand_off_cap=3,
                )
            )
            assert res.ok
            for h in res.value or []:
                await admitted.put(h.work_item_id)
            done += 1

    await asyncio.gather(finisher(), *(admit(wid) for wid in ids))
    assert peak <= limit
    states = await _raw(pg_store, "SELECT state, count(*) FROM work_items WHERE tenant_id = :t GROUP BY state", t=tid)
    assert dict((s, int(n)) for s, n in states) == {"succeeded": 20}
    admissions = await _raw(
        pg_store,
        "SELECT work_item_id, count(*) FROM events WHERE tenant_id = :t AND type = 'state_changed' "
        "AND data::jsonb ->> 'state' = 'admitted' GROUP BY work_item_id",
        t=tid,
    )
    assert sorted(int(n) for _w, n in admissions) == [1] * 20


async def test_the_functions_rank_span_is_the_python_one(pg_store: Store) -> None:
    """`crewwork_fenced_write` decodes ranks with Rank.SPAN written into its SQL: a stale refusal's event names the
    ranks exactly as Rank.decode does."""
    tid = await pg_store.ensure_tenant("server-span")
    row, _ = await pg_store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
    )
    w = {"work_item_id": row.id, "tenant_id": tid}
    assert (
        await pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(7, 999_999), writer="a"), state=S.admitted))
    ).ok
    late = await pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(7, 3), writer="b"), state=S.running))
    assert late.stale and late.current == Rank(7, 999_999)
    [(data,)] = await _raw(
        pg_store, "SELECT data::jsonb FROM events WHERE work_item_id = :w AND type = 'stale_write_rejected'", w=row.id
    )
    assert data == {"writer": "b", "presented": {"step": 7, "attempt": 3}, "current": {"step": 7, "attempt": 999_999}}


@pytest.mark.parametrize("server_writes", [True, False])
async def test_a_nul_in_untrusted_text_is_stored_replaced_on_every_path(any_store: Store, server_writes: bool) -> None:
    """A NUL in what an attempt reports (a test's failure message, an agent's claim, a reason, a result) cannot be
    stored by PostgreSQL in a text column or `jsonb`: it failed the write, and the attempt with it, on every retry.
    Every path stores it as U+FFFD instead, on both databases."""
    any_store.server_writes = server_writes and not any_store.is_sqlite
    tid = await any_store.ensure_tenant(f"nul-{server_writes}")
    row, _ = await any_store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
    )
    w = {"work_item_id": row.id, "tenant_id": tid}
    nul = "bad\x00byte"
    assert (
        await any_store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(1, 1), writer="run#1"),
                state=S.running,
                reason=nul,
                event_data={"claims": nul, nul: 1},
            )
        )
    ).ok
    assert (
        await any_store.fenced_event(
            FencedWrite(**w, rank=Rank(1, 1), writer="run#1"),
            type_="agent_finished",
            data={"message": nul, "tests": [{"id": nul}]},
        )
    ).ok
    record = AttemptRecord(
        number=1,
        verdict="failed",
        reason=nul,
        cause="test_failure",
        fingerprint=nul,
        agent={"claims": nul},
        validation={"tests": [{"message": nul}]},
    )
    assert (await any_store.record_attempt(FencedWrite(**w, rank=Rank(2, 1), writer="record#1"), record=record)).ok
    done = AttemptRecord(number=2, verdict="passed", reason=nul)
    assert (
        await any_store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(3, 1), writer="finish#1"),
                state=S.succeeded,
                reason=nul,
                fields={"result": {"reason": nul}},
                attempt=done,
            )
        )
    ).ok
    item = await any_store.get_work_item(row.id)
    assert item is not None and item.reason == "bad\ufffdbyte" and item.result == {"reason": "bad\ufffdbyte"}
    texts = await _raw(any_store, "SELECT data FROM events WHERE work_item_id = :w", w=row.id)
    texts += await _raw(
        any_store, "SELECT reason || fingerprint FROM attempts WHERE work_item_id = :w AND number = 1", w=row.id
    )
    dumped = json.dumps([str(t[0]) for t in texts])
    assert "\\u0000" not in dumped and "\x00" not in dumped
    assert "bad\\ufffdbyte" in dumped or "bad\ufffdbyte" in dumped


async def test_a_worker_on_an_older_schema_is_told_to_upgrade(pg_url: str, tmp_path: Any) -> None:
    """A database migrated only to 0007 has no crewwork_fenced_write: the first fenced write says what to do."""
    import subprocess
    import uuid

    from crewwork.store.db import upgrade
    from crewwork.store.engine import StoreError

    name = f"old_{uuid.uuid4().hex[:8]}"
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
    url = pg_url.rsplit("/", 1)[0] + "/" + name
    await upgrade(url, "0007")
    store = Store(url)
    try:
        tid = await store.ensure_tenant("old-schema")
        row, _ = await store.create_work_item(
            tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
        )
        with pytest.raises(StoreError, match="crewwork db upgrade"):
            await store.set_state(
                StateChange(
                    FencedWrite(work_item_id=row.id, tenant_id=tid, rank=Rank(1, 1), writer="a"), state=S.admitted
                )
            )
    finally:
        await store.close()
        subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", name], check=False)
