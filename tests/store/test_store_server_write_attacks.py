"""Attacks on the server-side fenced write (`crewwork_fenced_write`, migration 0008): inputs that jsonb takes
differently from the Python path's `json` columns (lone surrogates, floats jsonb's numeric rewrites, key order,
nulls), webhooks of odd shapes, locks held by a third connection, a dead pooled connection and a large artifact. Each
scenario runs through both paths and must leave the same rows, down to the stored text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.artifacts import new_artifact
from crewwork.store.fencing import FencedWrite, Rank, StateChange
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import AttemptRecord, Store

TASK = {"kind": "task", "input": {}}
S = WorkItemState
PATHS = [True, False]


async def _raw(store: Store, sql: str, **params: Any) -> list[Any]:
    async with store.engine.connect() as c:
        return list((await c.execute(text(sql), params)).all())


async def _item(store: Store, tenant: str) -> tuple[str, str]:
    tid = await store.ensure_tenant(tenant)
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
    )
    return tid, row.id


def _canon(raw: Any) -> Any:
    """A stored JSON text as a value that tells 1e16 from 10000000000000000 and -0.0 from 0.0, key order kept."""
    if raw is None:
        return None
    return json.dumps(json.loads(raw))


async def _rows(store: Store, tid: str, wid: str) -> dict[str, Any]:
    """Everything stored for the item, JSON columns as their stored text (canonicalised as above)."""
    items = await _raw(
        store,
        "SELECT state, reason, result::text, result IS NULL, fence_rank, state_rank, result_rank, attempt_count, "
        "delivery_branch, landed_commit, mock FROM work_items WHERE id = :w",
        w=wid,
    )
    events = await _raw(store, "SELECT type, data::text, rank FROM events WHERE work_item_id = :w ORDER BY id", w=wid)
    attempts = await _raw(
        store,
        "SELECT number, rank, verdict, reason, cause, fingerprint, agent::text, agent IS NULL, validation::text, "
        "validation IS NULL FROM attempts WHERE work_item_id = :w ORDER BY number",
        w=wid,
    )
    outbox = await _raw(
        store,
        "SELECT h.url, o.event_type, o.payload::text, o.status FROM outbox o JOIN webhooks h ON h.id = o.webhook_id "
        "WHERE o.work_item_id = :w ORDER BY h.url, o.id",
        w=wid,
    )

    def payload(raw: str) -> Any:
        value = json.loads(raw)
        value.pop("occurred_at", None)
        return json.dumps(value, sort_keys=True).replace(wid, "ITEM")

    return {
        "items": [(r[0], r[1], _canon(r[2]), *r[3:]) for r in items],
        "events": [(r[0], _canon(r[1]), r[2]) for r in events],
        "attempts": [(*r[:6], _canon(r[6]), r[7], _canon(r[8]), r[9]) for r in attempts],
        "outbox": [(r[0], r[1], payload(r[2]), r[3]) for r in outbox],
    }


Scenario = Callable[[Store, str, str], Awaitable[Any]]


async def _both(store: Store, name: str, scenario: Scenario) -> tuple[Any, Any]:
    """The scenario through the server path, then through the Python path, each on a fresh item and tenant: what
    each returned and left."""
    out = []
    for server in PATHS:
        store.server_writes = server
        tid, wid = await _item(store, f"{name}-{'server' if server else 'python'}")
        result = await scenario(store, tid, wid)
        out.append((result, await _rows(store, tid, wid)))
    store.server_writes = True
    return out[0], out[1]


def _assert_same(server: Any, python: Any) -> None:
    assert server[0] == python[0]
    for table in python[1]:
        assert server[1][table] == python[1][table], table


ODD_NUMBERS = {"big_float": 1e16, "huge_float": 1e300, "neg_zero": -0.0, "tiny": 1.5e-10, "two": 2.0, "int": 2**70}


async def test_floats_jsonb_would_rewrite_are_stored_as_the_python_path_stores_them(pg_store: Store) -> None:
    """jsonb keeps numbers as `numeric`: 1e16 came back as the integer 10000000000000000, 1e300 as an integer that
    is not 1e300, -0.0 as 0.0. The server path must store the JSON text the Python path stores."""

    async def scenario(store: Store, tid: str, wid: str) -> Any:
        w = {"work_item_id": wid, "tenant_id": tid}
        r1 = await store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(1, 1), writer="run#1"), state=S.running, event_data={"metrics": ODD_NUMBERS}
            )
        )
        r2 = await store.fenced_event(
            FencedWrite(**w, rank=Rank(1, 1), writer="run#1"), type_="evidence", data=ODD_NUMBERS
        )
        rec = AttemptRecord(number=1, verdict="failed", reason="r", agent={"cost": 1e16}, validation=ODD_NUMBERS)
        r3 = await store.record_attempt(FencedWrite(**w, rank=Rank(2, 1), writer="rec#1"), record=rec)
        r4 = await store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(3, 1), writer="fin#1"),
                state=S.succeeded,
                fields={"result": {"output": ODD_NUMBERS}},
            )
        )
        return [r.ok for r in (r1, r2, r3, r4)]

    server, python = await _both(pg_store, "odd-floats", scenario)
    _assert_same(server, python)
    assert server[0] == [True] * 4


async def test_key_order_of_json_values_is_the_python_one(pg_store: Store) -> None:
    """jsonb sorts keys (shorter first): the Python path keeps the order the dict had."""

    async def scenario(store: Store, tid: str, wid: str) -> Any:
        w = {"work_item_id": wid, "tenant_id": tid}
        data = {"zzzzzzzz": 1, "a": 2, "mmm": {"long_key_first": 1, "b": 2}}
        await store.fenced_event(FencedWrite(**w, rank=Rank(1, 1), writer="run#1"), type_="evidence", data=data)
        await store.set_state(
            StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="fin#1"), state=S.succeeded, fields={"result": data})
        )

    server, python = await _both(pg_store, "key-order", scenario)
    assert server[1]["events"] == python[1]["events"]
    assert server[1]["items"] == python[1]["items"]


LONE = "path/\udcff\udcfe.py"  # a file name of non-UTF-8 bytes, as `surrogateescape` decodes it (crewwork/boundary/paths.py)


@pytest.mark.parametrize("server", PATHS)
async def test_a_lone_surrogate_in_untrusted_text_does_not_fail_the_write(pg_store: Store, server: bool) -> None:
    """A changed file whose name is not UTF-8 is decoded with `surrogateescape`: its lone surrogates reach the
    evidence, the attempt record and the reason. jsonb refuses a lone surrogate and a text column cannot encode
    one: the write failed on every retry, like a NUL did. Every path stores U+FFFD instead."""
    pg_store.server_writes = server
    tid, wid = await _item(pg_store, f"surrogate-{server}")
    w = {"work_item_id": wid, "tenant_id": tid}
    assert (
        await pg_store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(1, 1), writer="run#1"),
                state=S.running,
                reason=LONE,
                event_data={"files": [LONE]},
            )
        )
    ).ok
    assert (
        await pg_store.fenced_event(FencedWrite(**w, rank=Rank(1, 1), writer="run#1"), type_="ev", data={LONE: LONE})
    ).ok
    rec = AttemptRecord(
        number=1, verdict="failed", reason=LONE, fingerprint=LONE, agent={"claims": LONE}, validation={"f": [LONE]}
    )
    assert (await pg_store.record_attempt(FencedWrite(**w, rank=Rank(2, 1), writer="rec#1"), record=rec)).ok
    assert (
        await pg_store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(3, 1), writer="fin#1"),
                state=S.succeeded,
                reason=LONE,
                fields={"result": {"f": LONE}},
            )
        )
    ).ok
    item = await pg_store.get_work_item(wid)
    assert item is not None and item.reason == "path/\ufffd\ufffd.py" and item.result == {"f": "path/\ufffd\ufffd.py"}
    events = await _raw(pg_store, "SELECT data::jsonb FROM events WHERE work_item_id = :w ORDER BY id", w=wid)
    assert "\\udc" not in json.dumps([e[0] for e in events])


async def test_nulls_empty_strings_and_empty_dicts_are_stored_alike(pg_store: Store) -> None:
    """`result` None, a reason of "" and of None, an attempt with empty agent and validation dicts, a nested
    null: SQL NULL where the Python path has SQL NULL, JSON null where it has JSON null."""

    async def scenario(store: Store, tid: str, wid: str) -> Any:
        w = {"work_item_id": wid, "tenant_id": tid}
        await store.set_state(
            StateChange(FencedWrite(**w, rank=Rank(1, 1), writer="run#1"), state=S.running, reason="")
        )
        await store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(1, 2), writer="run#2"),
                state=S.validating,
                reason=None,
                event_data={"x": None, "": ""},
            )
        )
        rec = AttemptRecord(number=1, verdict="failed", reason="", cause=None, fingerprint="", agent={}, validation={})
        await store.record_attempt(FencedWrite(**w, rank=Rank(2, 1), writer="rec#1"), record=rec)
        await store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(3, 1), writer="fin#1"),
                state=S.failed,
                reason="r",
                fields={"result": None, "delivery_branch": "", "landed_commit": None, "mock": False},
            )
        )

    server, python = await _both(pg_store, "nulls", scenario)
    _assert_same(server, python)


async def test_an_item_result_of_json_null_is_stored_alike(pg_store: Store) -> None:
    async def scenario(store: Store, tid: str, wid: str) -> Any:
        w = {"work_item_id": wid, "tenant_id": tid}
        await store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(1, 1), writer="fin#1"),
                state=S.failed,
                fields={"result": {"output": None, "n": [None]}},
            )
        )

    server, python = await _both(pg_store, "json-null", scenario)
    _assert_same(server, python)


async def test_event_data_overriding_state_and_writer_and_odd_values(pg_store: Store) -> None:
    """event_data may override the event's own keys; unicode, huge ints, nested lists and empty keys."""

    async def scenario(store: Store, tid: str, wid: str) -> Any:
        w = {"work_item_id": wid, "tenant_id": tid}
        data = {"state": "forged", "writer": "forged", "reason": None, "ü": "日本\u2028", "n": 10**30, "l": [[], {}]}
        r1 = await store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(1, 1), writer="run#1"), state=S.running, reason="go", event_data=data
            )
        )
        r2 = await store.fenced_event(
            FencedWrite(**w, rank=Rank(1, 1), writer="run#1"), type_="ev", data={"writer": "forged"}
        )
        # The refusals' events, built by the function itself: the Python path's keys, in its order.
        r3 = await store.fenced_event(FencedWrite(**w, rank=Rank(0, 5), writer='zombie "ü"'), type_="ev", data={})
        r4 = await store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="cancel#1"), state=S.cancelled))
        r5 = await store.set_state(StateChange(FencedWrite(**w, rank=Rank(3, 1), writer="late\u2028"), state=S.running))
        return [r1.ok, r2.ok, r3.stale, r4.ok, r5.closed]

    server, python = await _both(pg_store, "override", scenario)
    _assert_same(server, python)


async def test_webhooks_of_odd_shapes_get_the_same_outbox_rows(pg_store: Store) -> None:
    """Several hooks, an inactive one, event type lists with empty entries, another event type only, and another
    tenant's hook: the same hooks are notified on both paths, hand-offs included."""

    async def scenario(store: Store, tid: str, wid: str) -> Any:
        other = await store.ensure_tenant(f"other-of-{tid}")
        hooks = OutboxStore(store)
        await hooks.create_webhook(other, "http://127.0.0.1:9/other-tenant", [])
        await hooks.create_webhook(tid, "http://127.0.0.1:9/all", [])
        await hooks.create_webhook(tid, "http://127.0.0.1:9/empty-entries", ["", "work_item.state_changed"])
        await hooks.create_webhook(tid, "http://127.0.0.1:9/elsewhere", ["work_item.other"])
        await hooks.create_webhook(tid, "http://127.0.0.1:9/comma", [","])
        dead = await hooks.create_webhook(tid, "http://127.0.0.1:9/inactive", [])
        await _raw(store, "SELECT 1")
        async with store.engine.begin() as c:
            await c.execute(text("UPDATE webhooks SET active = false WHERE id = :h"), {"h": dead.id})
            await c.execute(
                text(
                    "INSERT INTO webhooks (id, tenant_id, url, secret, event_types, active, created_at) VALUES "
                    "(:h, :t, 'http://127.0.0.1:9/raw', 's', ',work_item.state_changed,,', true, 0)"
                ),
                {"h": f"wh_raw_{tid}", "t": tid},
            )
        w = {"work_item_id": wid, "tenant_id": tid}
        _queued_tid, queued = (
            tid,
            (
                await store.create_work_item(
                    tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
                )
            )[0].id,
        )

        async def fp(_s: Any, _w: str) -> list[str | None]:
            return []

        a = await store.admit(FencedWrite(**w, rank=Rank(1, 1), writer="admit#1"), max_in_flight=1, fingerprints=fp)
        b = await store.admit(
            FencedWrite(work_item_id=queued, tenant_id=tid, rank=Rank(1, 1), writer="admit#1"),
            max_in_flight=1,
            fingerprints=fp,
        )
        done = await store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(2, 1), writer="fin#1"),
                state=S.succeeded,
                reason="done",
                fields={"delivery_branch": "crewwork/x", "landed_commit": "abc", "result": {"pull_request_url": "u"}},
                max_in_flight=1,
                hand_off_cap=2,
            )
        )
        handed = await _raw(
            store,
            "SELECT h.url, o.payload::jsonb ->> 'state' FROM outbox o JOIN webhooks h ON h.id = o.webhook_id "
            "WHERE o.work_item_id = :w ORDER BY h.url, o.id",
            w=queued,
        )
        return [a.value, b.value, len(done.value or []), handed]

    server, python = await _both(pg_store, "hooks", scenario)
    _assert_same(server, python)
    urls = sorted({r[0] for r in server[1]["outbox"]})
    assert urls == [f"http://127.0.0.1:9/{n}" for n in ("all", "comma", "empty-entries", "raw")]


@pytest.mark.parametrize("server", PATHS)
async def test_a_hand_off_skips_a_queued_row_locked_by_a_third_connection_alike(pg_store: Store, server: bool) -> None:
    """A queued item's row is held (SELECT ... FOR UPDATE) by another connection while a running item ends: the
    hand-off does not wait for it, and leaves it the freed place (FencingStore.hand_off: a locked queued row is
    taken to be admitting itself), on both paths alike; nothing further down the queue is handed that place."""
    pg_store.server_writes = server
    tid = await pg_store.ensure_tenant(f"locked-queued-{server}")
    ids = []
    for _ in range(3):
        row, _ = await pg_store.create_work_item(
            tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
        )
        ids.append(row.id)

    async def fp(_s: Any, _w: str) -> list[str | None]:
        return []

    for wid in ids:
        assert (
            await pg_store.admit(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="admit#1"),
                max_in_flight=1,
                fingerprints=fp,
            )
        ).ok
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM work_items WHERE id = :w FOR UPDATE"), {"w": ids[1]})
        done = await asyncio.wait_for(
            pg_store.set_state(
                StateChange(
                    FencedWrite(work_item_id=ids[0], tenant_id=tid, rank=Rank(2, 1), writer="fin#1"),
                    state=S.succeeded,
                    max_in_flight=1,
                    hand_off_cap=3,
                )
            ),
            10,
        )
        await holder.rollback()
    assert done.ok and done.value == []
    states = await _raw(pg_store, "SELECT id, state FROM work_items WHERE tenant_id = :t", t=tid)
    assert dict(states) == {ids[0]: "succeeded", ids[1]: "queued", ids[2]: "queued"}
    # The held item, admitting itself now, finds its place free.
    again = await pg_store.admit(
        FencedWrite(work_item_id=ids[1], tenant_id=tid, rank=Rank(1, 2), writer="admit#2"),
        max_in_flight=1,
        fingerprints=fp,
    )
    assert again.ok and again.value is not None and again.value.admitted


@pytest.mark.parametrize("driver", [True, False])
async def test_a_pooled_connection_killed_before_a_server_write_costs_a_retry(pg_url: str, driver: bool) -> None:
    """pg_terminate_backend of the pool's only connection (no pre-ping): the next fenced write runs once, on a
    fresh connection, and is not applied twice; sent on the driver (`Database.driver_scalar`) or through
    SQLAlchemy (CREWWORK_STORE_DRIVER_WRITES=false)."""
    store = Store(pg_url, pool_size=1, pre_ping=False, driver_writes=driver)
    try:
        tid, wid = await _item(store, "killed-conn")
        w = {"work_item_id": wid, "tenant_id": tid}
        assert (await store.set_state(StateChange(FencedWrite(**w, rank=Rank(1, 1), writer="a"), state=S.admitted))).ok
        [(pid,)] = await _raw(store, "SELECT pg_backend_pid()")
        async with Store(pg_url).engine.connect() as killer:
            await killer.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        await asyncio.sleep(0.2)
        res = await store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="b"), state=S.running))
        assert res.ok and res.current == Rank(1, 1)
        changes = await _raw(
            store, "SELECT count(*) FROM events WHERE work_item_id = :w AND type = 'state_changed'", w=wid
        )
        assert changes == [(2,)]
    finally:
        await store.close()


async def test_a_ten_megabyte_artifact_is_stored_whole_on_both_paths(pg_store: Store) -> None:
    blob = bytes(range(256)) * (10 * 1024 * 1024 // 256)

    async def scenario(store: Store, tid: str, wid: str) -> Any:
        art = new_artifact(
            work_item_id=wid,
            tenant_id=tid,
            name="t",
            data=blob,
            content_type="application/octet-stream",
            max_bytes=len(blob),
        )
        res = await store.fenced_event(
            FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="w"),
            type_="ev",
            data={},
            artifacts=[art],
        )
        [(size, sha, same)] = await _raw(
            store, "SELECT size, sha256, content = :b FROM artifacts WHERE id = :a", a=art.id, b=blob
        )
        return [res.ok, size, sha == art.sha256, same]

    server, python = await _both(pg_store, "big-artifact", scenario)
    _assert_same(server, python)
    assert server[0] == [True, len(blob), True, True]


async def test_equal_rank_writes_racing_a_stale_one_behind_a_held_lock(pg_store: Store) -> None:
    """Two copies of one attempt (equal rank) and an older attempt all wait for the row held by a third connection:
    both copies are accepted, the older one refused with only its event, whatever the order of the waits."""
    tid, wid = await _item(pg_store, "equal-ranks")
    w = {"work_item_id": wid, "tenant_id": tid}
    assert (await pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(1, 1), writer="a"), state=S.admitted))).ok
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM work_items WHERE id = :w FOR UPDATE"), {"w": wid})
        old = asyncio.create_task(
            pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="old"), state=S.validating))
        )
        await asyncio.sleep(0.1)
        c1 = asyncio.create_task(
            pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 2), writer="copy1"), state=S.running))
        )
        c2 = asyncio.create_task(
            pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 2), writer="copy2"), state=S.running))
        )
        await asyncio.sleep(0.3)
        await holder.rollback()
    r_old, r1, r2 = await asyncio.wait_for(asyncio.gather(old, c1, c2), 10)
    assert r1.ok and r2.ok
    item = await pg_store.get_work_item(wid)
    assert item is not None and item.state == "running" and item.fence_rank == Rank(2, 2).encode()
    # The old one either went first (accepted, then outranked) or last (refused): never after a copy.
    events = await _raw(
        pg_store, "SELECT type, data::jsonb ->> 'writer' FROM events WHERE work_item_id = :w ORDER BY id", w=wid
    )
    writers = [e[1] for e in events if e[0] == "state_changed"]
    if r_old.ok:
        assert writers.index("old") < writers.index("copy1")
    else:
        assert "old" not in writers and ("stale_write_rejected", "old") in events


async def test_a_secret_in_an_admissions_writer_is_masked_alike(pg_store: Store) -> None:
    """The state changes an admission makes (admitted, queued) carry the writer in their event: masked on the
    Python path by change_state; the server path builds that event itself."""

    async def scenario(store: Store, tid: str, wid: str) -> Any:
        second, _ = await store.create_work_item(
            tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
        )

        async def fp(_s: Any, _w: str) -> list[str | None]:
            return []

        writer = "admit token=sk-abcdefghijklmnopqrstuvwx"
        await store.admit(
            FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer=writer),
            max_in_flight=1,
            fingerprints=fp,
        )
        await store.admit(
            FencedWrite(work_item_id=second.id, tenant_id=tid, rank=Rank(1, 1), writer=writer),
            max_in_flight=1,
            fingerprints=fp,
        )
        return await _raw(
            store,
            "SELECT data::jsonb ->> 'writer' FROM events WHERE work_item_id = :w AND type = 'state_changed'",
            w=second.id,
        )

    server, python = await _both(pg_store, "masked-writer", scenario)
    _assert_same(server, python)
    assert "sk-abcdefghijklmnopqrstuvwx" not in str(server)


async def _wait_blocked(store: Store, count: int = 1) -> list[int]:
    """Until `count` backends of this database wait for a lock: their pids."""
    for _ in range(300):
        rows = await _raw(
            store, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if len(rows) >= count:
            return [int(r[0]) for r in rows]
        await asyncio.sleep(0.02)
    raise AssertionError("the write never waited for the lock")


@pytest.mark.parametrize("server", PATHS)
async def test_a_webhook_registered_while_a_finish_waits_for_the_tenant_lock_gets_the_change(
    pg_store: Store, server: bool
) -> None:
    """A third connection holds the tenant row (as an admission does) while an item's finish, which hands its place
    on, waits for it; a webhook is registered meanwhile: the finish, and the hand-off it makes, are announced."""
    pg_store.server_writes = server
    tid = await pg_store.ensure_tenant(f"tenant-lock-hook-{server}")
    ids = []
    for _ in range(2):
        row, _ = await pg_store.create_work_item(
            tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
        )
        ids.append(row.id)

    async def fp(_s: Any, _w: str) -> list[str | None]:
        return []

    for wid in ids:
        await pg_store.admit(
            FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="admit#1"),
            max_in_flight=1,
            fingerprints=fp,
        )
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM tenants WHERE id = :t FOR NO KEY UPDATE"), {"t": tid})
        finish = asyncio.create_task(
            pg_store.set_state(
                StateChange(
                    FencedWrite(work_item_id=ids[0], tenant_id=tid, rank=Rank(2, 1), writer="fin#1"),
                    state=S.succeeded,
                    max_in_flight=1,
                    hand_off_cap=2,
                )
            )
        )
        await _wait_blocked(pg_store)
        await OutboxStore(pg_store).create_webhook(tid, "http://127.0.0.1:9/hook", [])
        await holder.rollback()
    res = await asyncio.wait_for(finish, 10)
    assert res.ok and [h.work_item_id for h in res.value or []] == [ids[1]]
    rows = await _raw(
        pg_store, "SELECT work_item_id, payload::jsonb ->> 'state' FROM outbox WHERE tenant_id = :t ORDER BY id", t=tid
    )
    assert sorted(rows) == sorted([(ids[0], "succeeded"), (ids[1], "admitted")])


@pytest.mark.parametrize("server", PATHS)
async def test_a_write_whose_backend_is_killed_while_it_waits_for_the_row_is_applied_once(
    pg_store: Store, server: bool
) -> None:
    """The write waits for the item's row, and its backend is terminated meanwhile (a failover, an operator):
    nothing of it had happened, so it runs once more on a fresh connection, waits again, and is applied once."""
    pg_store.server_writes = server
    tid, wid = await _item(pg_store, f"killed-waiting-{server}")
    w = {"work_item_id": wid, "tenant_id": tid}
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM work_items WHERE id = :w FOR UPDATE"), {"w": wid})
        write = asyncio.create_task(
            pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(1, 1), writer="a"), state=S.admitted))
        )
        [pid] = await _wait_blocked(pg_store)
        await holder.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        await asyncio.sleep(0.3)
        await _wait_blocked(pg_store)  # the second run waits too
        await holder.rollback()
    res = await asyncio.wait_for(write, 10)
    assert res.ok
    changes = await _raw(
        pg_store, "SELECT count(*) FROM events WHERE work_item_id = :w AND type = 'state_changed'", w=wid
    )
    assert changes == [(1,)]


@pytest.mark.parametrize("server", PATHS)
async def test_a_write_cancelled_while_it_waits_for_the_row_is_not_applied_later(pg_store: Store, server: bool) -> None:
    """The activity is cancelled (its heartbeat timed out) while its write waits for the item's row: when the row is
    released, the write that its caller saw cancelled must not commit behind its back. The connection it used goes
    back to the pool usable."""
    pg_store.server_writes = server
    tid, wid = await _item(pg_store, f"cancelled-waiting-{server}")
    w = {"work_item_id": wid, "tenant_id": tid}
    async with pg_store.engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM work_items WHERE id = :w FOR UPDATE"), {"w": wid})
        write = asyncio.create_task(
            pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(1, 1), writer="a"), state=S.admitted))
        )
        await _wait_blocked(pg_store)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        await asyncio.sleep(0.2)
        await holder.rollback()
    await asyncio.sleep(0.3)
    item = await pg_store.get_work_item(wid)
    assert item is not None and item.state == "submitted"
    assert (await pg_store.set_state(StateChange(FencedWrite(**w, rank=Rank(1, 2), writer="b"), state=S.admitted))).ok


async def test_server_and_python_workers_racing_at_the_limit_never_exceed_it(pg_url: str) -> None:
    """A rolling upgrade: workers on the server path and on the Python path admit and finish one tenant's items at
    once. At no point are more than the limit in flight, and every item is admitted exactly once."""
    limit = 2
    stores = [Store(pg_url), Store(pg_url, server_writes=False)]
    try:
        tid = await stores[0].ensure_tenant("mixed-race")
        ids = []
        for _ in range(16):
            row, _ = await stores[0].create_work_item(
                tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
            )
            ids.append(row.id)
        peak = 0

        async def no_fp(_s: Any, _w: str) -> list[str | None]:
            return []

        admitted: asyncio.Queue[str] = asyncio.Queue()

        async def admit(n: int, wid: str) -> None:
            res = await stores[n % 2].admit(
                FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="a"),
                max_in_flight=limit,
                fingerprints=no_fp,
            )
            assert res.ok and res.value is not None
            if res.value.admitted:
                await admitted.put(wid)

        done = 0

        async def finisher(n: int) -> None:
            nonlocal peak, done
            deadline = asyncio.get_running_loop().time() + 30
            while done < len(ids):
                assert asyncio.get_running_loop().time() < deadline, "an item was never admitted"
                try:
                    wid = await asyncio.wait_for(admitted.get(), 0.2)
                except TimeoutError:
                    continue
                rows = await _raw(
                    stores[0],
                    "SELECT count(*) FROM work_items WHERE tenant_id = :t AND state IN "
                    "('admitted','running','validating','landing')",
                    t=tid,
                )
                peak = max(peak, int(rows[0][0]))
                res = await stores[n % 2].set_state(
                    StateChange(
                        FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(2, 1), writer="f"),
                        state=S.succeeded,
                        max_in_flight=limit,
                        hand_off_cap=2,
                    )
                )
                assert res.ok
                done += 1
                for h in res.value or []:
                    await admitted.put(h.work_item_id)

        await asyncio.gather(finisher(0), finisher(1), *(admit(n, wid) for n, wid in enumerate(ids)))
        assert peak <= limit
        states = await _raw(
            stores[0], "SELECT state, count(*) FROM work_items WHERE tenant_id = :t GROUP BY state", t=tid
        )
        assert dict((s, int(n)) for s, n in states) == {"succeeded": 16}
        admissions = await _raw(
            stores[0],
            "SELECT work_item_id, count(*) FROM events WHERE tenant_id = :t AND type = 'state_changed' "
            "AND data::jsonb ->> 'state' = 'admitted' GROUP BY work_item_id",
            t=tid,
        )
        assert sorted(int(n) for _w, n in admissions) == [1] * 16
    finally:
        for s in stores:
            await s.close()


async def test_the_driver_path_and_the_sqlalchemy_path_leave_the_same_rows(pg_url: str) -> None:
    """The same writes (admission, state changes with a result and an attempt, an evidence event with its artifact,
    a stale write) sent on the driver and through SQLAlchemy answer alike and leave the same rows."""
    stores = [Store(pg_url, driver_writes=True), Store(pg_url, driver_writes=False)]
    try:
        seen = []
        for i, store in enumerate(stores):
            tid, wid = await _item(store, f"driver-vs-sqlalchemy-{i}")
            w = {"work_item_id": wid, "tenant_id": tid}

            async def no_fp(_s: Any, _w: str) -> list[str | None]:
                return []

            adm = await store.admit(
                FencedWrite(**w, rank=Rank(1, 1), writer="admit"), max_in_flight=5, fingerprints=no_fp
            )
            run = await store.set_state(StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="a"), state=S.running))
            art = new_artifact(
                work_item_id=wid, tenant_id=tid, name="t", data=b"x" * 300, content_type="text/plain", max_bytes=1000
            )
            ev = await store.fenced_event(
                FencedWrite(**w, rank=Rank(2, 1), writer="a"), type_="evidence", data={"k": 1e16}, artifacts=[art]
            )
            stale = await store.set_state(
                StateChange(FencedWrite(**w, rank=Rank(1, 2), writer="zombie"), state=S.failed)
            )
            done = await store.set_state(
                StateChange(
                    FencedWrite(**w, rank=Rank(3, 1), writer="f"),
                    state=S.succeeded,
                    fields={"result": {"output": {"a": [1, -0.0]}}},
                )
            )
            assert adm.ok and run.ok and ev.ok and done.ok and not stale.ok
            seen.append(
                (
                    adm.value,
                    stale.current,
                    await _rows(store, tid, wid),
                )
            )
        assert seen[0] == seen[1]
    finally:
        for store in stores:
            await store.close()
