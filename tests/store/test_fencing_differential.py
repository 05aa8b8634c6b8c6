"""One definition of the fencing rules, proven by a differential property test.

The fenced write exists as the Python path (SQLite always; PostgreSQL with `server_writes=False`) and as the
server-side function `crewwork_fenced_write` (PostgreSQL, migration 0008). Hypothesis draws sequences of writers as
Temporal schedules them: attempts of steps with their ranks (step, attempt), retries, stale attempts waking late,
equal-rank re-runs, terminal writes, writes to missing items, admissions under a tenant limit, hand-offs, attempt
records, evidence events with artifacts. Each sequence runs through every implementation, each on a fresh tenant,
and the outcomes (accepted or rejected, and why) and everything stored (item rows, events, attempt records,
artifacts, outbox rows) must be the same. A second property runs random batches of writers *concurrently* against
each implementation and checks the rules that hold whatever order the races resolve in: a stale attempt never wins.

Run: `pytest tests/store/test_fencing_differential.py` (the `ci` profile, well under a minute). Deeper:
`CREWWORK_HYPOTHESIS_PROFILE=deep pytest tests/store/test_fencing_differential.py` (bench/ or by hand).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.artifacts import new_artifact
from crewwork.store.db import upgrade
from crewwork.store.fencing import IN_FLIGHT_STATES, FencedWrite, Rank, StateChange
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import AttemptRecord, Store
from tests.conftest import run_sync

pytestmark = pytest.mark.postgres

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("CREWWORK_HYPOTHESIS_PROFILE", "ci")

S = WorkItemState
STATES = [s.value for s in WorkItemState]
TASK = {"kind": "task", "input": {}}
ITEMS = 3
"""Work items per tenant; an op on item index ITEMS writes to an id that is not in the store."""

# ------------------------------------------------------------------------------------------------ the writers

ranks = st.builds(Rank, st.integers(0, 4), st.integers(0, 3))
items = st.integers(0, ITEMS)  # ITEMS: missing
limits = st.sampled_from([None, 1, 1, 1, 2, 3])  # mostly a tenant limit of one: places are scarce
texts = st.sampled_from(["", "ok", "token=sk-abcdefghijklmnopqrstuvwx", "é\u2603", "a\x00b", "lone \ud800"])
numbers = st.sampled_from([0, -0.0, 2.0, 1e16, 1e300, 1.5e-10, 2**70, -1])


@dataclass(frozen=True)
class Op:
    kind: str
    item: int
    rank: Rank
    args: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # short, for the falsifying example
        return f"Op({self.kind!r}, {self.item}, Rank({self.rank.step}, {self.rank.attempt}), {self.args!r})"


records = st.builds(
    lambda n, verdict, fp, reason, agent: {
        "number": n,
        "verdict": verdict,
        "reason": reason,
        "fingerprint": fp,
        "cause": None if verdict == "passed" else "agent",
        "agent": agent,
    },
    st.integers(1, 3),
    st.sampled_from(["passed", "failed", "error"]),
    st.sampled_from([None, "fp-a", "fp-b", "fp \x00"]),
    texts,
    st.one_of(
        st.sampled_from([None, {}, {"diff_ref": {"id": "ar_1"}, "n": 1.5}]),
        st.builds(lambda t, n: {"claim": t, "n": n, "diff_ref": {"id": t}}, texts, numbers),
    ),
)
fields_ = st.fixed_dictionaries(
    {},
    optional={
        "result": st.one_of(
            st.sampled_from([None, {"state": "succeeded", "x": [1, 2.5, -0.0]}, {"pull_request_url": "u"}]),
            st.builds(lambda t, n: {"reason": t, "n": n, "z": {"b": 1, "a": 2}}, texts, numbers),
        ),
        "delivery_branch": st.sampled_from([None, "crew/b", "crew/\x00"]),
        "landed_commit": st.sampled_from([None, "abc123"]),
        "mock": st.booleans(),
    },
)

set_state = st.builds(
    lambda item, rank, state, reason, fields, event_data, attempt, limit, cap: Op(
        "set_state",
        item,
        rank,
        {
            "state": state,
            "reason": reason,
            "fields": fields or None,
            "event_data": event_data,
            "attempt": attempt,
            "max_in_flight": limit,
            "hand_off_cap": cap,
        },
    ),
    items,
    ranks,
    st.sampled_from(STATES),
    st.one_of(st.none(), texts),
    fields_,
    st.one_of(st.sampled_from([None, {"k": "v"}, {"state": "forged"}]), st.builds(lambda t: {"k": t}, texts)),
    st.one_of(st.none(), records),
    limits,
    st.sampled_from([0, 1, 3, 3]),
)
admit = st.builds(lambda item, rank, limit: Op("admit", item, rank, {"max_in_flight": limit}), items, ranks, limits)
record = st.builds(lambda item, rank, r: Op("record", item, rank, {"record": r}), items, ranks, records)
event = st.builds(
    lambda item, rank, data, n: Op("event", item, rank, {"data": data, "artifacts": n}),
    items,
    ranks,
    st.one_of(
        st.sampled_from([{}, {"diff_ref": "x", "size": 2.0}, {"note": "token=sk-abcdefghijklmnopqrstuvwx"}]),
        st.builds(lambda t: {"note": t, "nested": [t, {"k": t}]}, texts),
    ),
    st.integers(0, 2),
)
ops = st.one_of(set_state, set_state, admit, admit, record, event)


@dataclass(frozen=True)
class Scenario:
    hooks: tuple[str, ...]
    """Event types of the tenant's webhooks ('' = all events; none = no webhook)."""
    ops: tuple[Op, ...]


scenarios = st.builds(
    Scenario,
    st.lists(st.sampled_from(["", "work_item.state_changed", "work_item.other"]), max_size=2).map(tuple),
    st.lists(ops, min_size=1, max_size=14).map(tuple),
)

LIFECYCLE = ["running", "validating", "awaiting_review", "landing", "succeeded", "failed", "cancelled", "dead"]


@st.composite
def lifecycles(draw: st.DrawFn) -> Scenario:
    """Items going through their steps as their workflows schedule them (step numbers rising, retries taking the
    next attempt, the tenant's one limit on every admission and hand-off), interleaved, with zombies: copies of
    earlier writes at an earlier attempt, waking later."""
    limit = draw(st.sampled_from([1, 2]))
    queues: list[list[Op]] = []
    for item in range(ITEMS):
        steps: list[Op] = [Op("admit", item, Rank(1, draw(st.integers(1, 2))), {"max_in_flight": limit})]
        for step in range(2, draw(st.integers(1, 6)) + 1):
            rank = Rank(step, draw(st.integers(1, 3)))
            kind = draw(st.sampled_from(["set_state", "set_state", "record", "event"]))
            if kind == "set_state":
                state = draw(st.sampled_from(LIFECYCLE))
                steps.append(_state(item, rank, state, max_in_flight=limit, hand_off_cap=3))
            elif kind == "record":
                steps.append(Op("record", item, rank, {"record": draw(records)}))
            else:
                steps.append(Op("event", item, rank, {"data": {}, "artifacts": draw(st.integers(0, 1))}))
        queues.append(steps)
    merged: list[Op] = []
    while any(queues):
        i = draw(st.sampled_from([k for k, q in enumerate(queues) if q]))
        merged.append(queues[i].pop(0))
    for src, pos in draw(st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99)), max_size=3)):
        op = merged[src % len(merged)]
        zombie = Op(op.kind, op.item, Rank(op.rank.step, max(0, op.rank.attempt - 1)), op.args)
        merged.insert(max(pos % (len(merged) + 1), src % len(merged) + 1), zombie)
    return Scenario(hooks=("",) if draw(st.booleans()) else (), ops=tuple(merged))


# ------------------------------------------------------------------------------------------------ running them


class Runner:
    """The implementations under test, each a store on its own engine, driven from one event loop of its own
    (Hypothesis calls the test synchronously; the stores' engines belong to this loop)."""

    def __init__(self, sqlite_url: str, pg_url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.stores: dict[str, Store] = {
            "python-sqlite": Store(sqlite_url),
            "python-postgres": Store(pg_url, server_writes=False),
            "server-postgres": Store(pg_url),
        }
        assert not self.stores["python-postgres"].server_writes and self.stores["server-postgres"].server_writes

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        for store in self.stores.values():
            self.run(store.close())
        self.loop.close()


@pytest.fixture(scope="module")
def runner(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    path = tmp_path_factory.mktemp("differential") / "crewwork.db"
    url = f"sqlite+aiosqlite:///{path}"
    run_sync(upgrade(url))
    r = Runner(url, pg_url)
    yield r
    r.close()


async def _setup(store: Store, hooks: tuple[str, ...]) -> tuple[str, list[str]]:
    tid = await store.ensure_tenant(f"diff-{uuid.uuid4().hex[:12]}")
    for i, types in enumerate(hooks):
        if i:
            # Ids order by their millisecond, then at random: two webhooks made in one millisecond could order either
            # way, and every implementation writes a change's outbox rows in the order of its webhooks' ids.
            await asyncio.sleep(0.002)
        await OutboxStore(store).create_webhook(tid, f"http://127.0.0.1:9/hook{i}", [types] if types else [])
    ids = []
    for _ in range(ITEMS):
        row, _ = await store.create_work_item(
            tenant_id=tid, spec=WorkItemSpec.model_validate(TASK), base_commit=None, repo_path=None
        )
        ids.append(row.id)
    return tid, [*ids, f"wi_missing_{uuid.uuid4().hex[:8]}"]


def _record(r: dict[str, Any]) -> AttemptRecord:
    return AttemptRecord(**r)


async def _apply(store: Store, tid: str, ids: list[str], op: Op) -> Any:
    """Run one writer; its outcome with item ids replaced by their index."""
    wid = ids[op.item]
    # Item 1's writers name a secret (a writer is masked wherever an event names it) and a NUL.
    writer = f"{op.kind}#{op.rank.attempt}" + (" token=sk-abcdefghijklmnopqrstuvwx \x00" if op.item == 1 else "")
    write = FencedWrite(wid, tid, op.rank, writer)
    a = op.args
    if op.kind == "set_state":
        res = await store.set_state(
            StateChange(
                write,
                state=S(a["state"]),
                reason=a["reason"],
                fields=a["fields"],
                event_data=a["event_data"],
                attempt=_record(a["attempt"]) if a["attempt"] else None,
                max_in_flight=a["max_in_flight"],
                hand_off_cap=a["hand_off_cap"],
            )
        )
        value: Any = None if res.value is None else sorted(ids.index(h.work_item_id) for h in res.value)
    elif op.kind == "admit":
        res = await store.admit(write, max_in_flight=a["max_in_flight"], fingerprints=store.fingerprints_in)
        adm = res.value
        value = None if adm is None else (adm.admitted, adm.queued_position, adm.in_flight, adm.fingerprints)
    elif op.kind == "record":
        res = await store.record_attempt(write, record=_record(a["record"]))
        value = res.value
    else:
        arts = [
            new_artifact(
                work_item_id=wid,
                tenant_id=tid,
                name=f"log{i}",
                data=f"evidence {i}".encode(),
                content_type="text/plain",
                max_bytes=1000,
            )
            for i in range(a["artifacts"])
        ]
        res = await store.fenced_event(write, type_="evidence", data=a["data"], artifacts=arts)
        value = res.value
    return {
        "ok": res.ok,
        "closed": res.closed,
        "missing": res.missing,
        "state": res.state,
        "current": res.current,
        "value": value,
    }


def _json(raw: Any) -> Any:
    """A JSON column as a value (SQLite hands back the stored text or the decoded value, PostgreSQL's `json` the
    text it stores): compared as decoded values with their key order, and -0.0 told from 0.0."""
    if raw is None:
        return None
    value = json.loads(raw) if isinstance(raw, str) else raw
    return json.dumps(value)


async def _rows(store: Store, tid: str, ids: list[str]) -> dict[str, Any]:
    """Everything the tenant's items hold, ids and times left out (ids as their index)."""

    def idx(value: str) -> str:
        for i, wid in enumerate(ids):
            value = value.replace(wid, f"ITEM{i}")
        return value

    async with store.engine.connect() as c:

        async def q(sql: str) -> list[Any]:
            return list((await c.execute(text(sql), {"t": tid})).all())

        by_id = {wid: i for i, wid in enumerate(ids)}
        item_rows = await q(
            "SELECT id, state, reason, CAST(result AS TEXT), fence_rank, state_rank, result_rank, attempt_count, delivery_branch, "
            "landed_commit, mock FROM work_items WHERE tenant_id = :t"
        )
        events = await q(
            "SELECT work_item_id, type, CAST(data AS TEXT), rank FROM events WHERE tenant_id = :t ORDER BY id"
        )
        attempts = await q(
            "SELECT a.work_item_id, a.number, a.rank, a.verdict, a.reason, a.cause, a.fingerprint, CAST(a.agent AS TEXT), "
            "CAST(a.validation AS TEXT) FROM attempts a JOIN work_items w ON w.id = a.work_item_id WHERE w.tenant_id = :t "
            "ORDER BY a.work_item_id, a.number"
        )
        artifacts = await q(
            "SELECT work_item_id, name, content_type, size, sha256 FROM artifacts WHERE tenant_id = :t ORDER BY "
            "work_item_id, name"
        )
        outbox = await q(
            "SELECT o.work_item_id, h.url, o.event_type, CAST(o.payload AS TEXT), o.status FROM outbox o "
            "JOIN webhooks h ON h.id = o.webhook_id WHERE o.tenant_id = :t ORDER BY o.id"
        )

    def payload(raw: Any) -> str:
        value = json.loads(raw) if isinstance(raw, str) else dict(raw)
        value.pop("occurred_at", None)
        return idx(json.dumps(value, sort_keys=True))

    return {
        "items": sorted(
            (by_id[r[0]], r[1], r[2], _json(r[3]), *r[4:9], r[9], None if r[10] is None else bool(r[10]))
            for r in item_rows
        ),
        "events": [(by_id[r[0]], r[1], idx(_json(r[2]) or ""), r[3]) for r in events],
        # By item index: ids are not made in the same order by every run.
        "attempts": sorted((by_id[r[0]], *r[1:7], _json(r[7]), _json(r[8])) for r in attempts),
        "artifacts": sorted((by_id[r[0]], *r[1:]) for r in artifacts),
        "outbox": [(by_id[r[0]], *r[1:3], payload(r[3]), r[4]) for r in outbox],
    }


async def _run(store: Store, scenario: Scenario) -> tuple[list[Any], dict[str, Any]]:
    tid, ids = await _setup(store, scenario.hooks)
    outcomes = []
    for op in scenario.ops:
        outcomes.append(await _apply(store, tid, ids, op))
    return outcomes, await _rows(store, tid, ids)


def _compare(runner: Runner, scenario: Scenario) -> None:
    results = {name: runner.run(_run(store, scenario)) for name, store in runner.stores.items()}
    (ref_name, (ref_out, ref_rows)), *others = results.items()
    for name, (out, rows) in others:
        for i, (a, b) in enumerate(zip(ref_out, out, strict=True)):
            assert a == b, f"op {i} {scenario.ops[i]!r}: {ref_name} {a} != {name} {b}"
        for table in ref_rows:
            assert ref_rows[table] == rows[table], f"{table}: {ref_name} != {name}"


# ------------------------------------------------------------------------------------------------ the properties

ADMIT = Rank(1, 1)


def _state(item: int, rank: Rank, state: str, **args: Any) -> Op:
    """A state change with no extras (for the named examples)."""
    base = {"reason": None, "fields": None, "event_data": None, "attempt": None, "max_in_flight": None}
    return Op("set_state", item, rank, {**base, "hand_off_cap": 0, **args, "state": state})


@settings(settings.get_profile(PROFILE))
@given(scenario=st.one_of(scenarios, lifecycles()))
@example(  # the basic order: an attempt retried, its stale first attempt waking late, then the item closed
    scenario=Scenario(
        hooks=("",),
        ops=(
            Op("admit", 0, ADMIT, {"max_in_flight": 1}),
            Op("admit", 1, ADMIT, {"max_in_flight": 1}),
            _state(0, Rank(2, 2), "running", reason="r"),
            Op("event", 0, Rank(2, 1), {"data": {}, "artifacts": 1}),
            _state(0, Rank(3, 1), "succeeded", fields={"result": None}, max_in_flight=1, hand_off_cap=3),
            Op(
                "record",
                0,
                Rank(4, 1),
                {
                    "record": {
                        "number": 1,
                        "verdict": "failed",
                        "reason": "late",
                        "fingerprint": "fp",
                        "cause": "agent",
                        "agent": None,
                    }
                },
            ),
        ),
    )
)
@example(  # a queued item that ends hands on the place a hand-off that found its row locked left it
    scenario=Scenario(
        hooks=(),
        ops=(
            Op("admit", 0, ADMIT, {"max_in_flight": 1}),
            Op("admit", 1, ADMIT, {"max_in_flight": 1}),
            Op("admit", 2, ADMIT, {"max_in_flight": 1}),
            _state(0, Rank(2, 1), "awaiting_review"),
            _state(1, Rank(2, 1), "cancelled", max_in_flight=1, hand_off_cap=3),
        ),
    )
)
@example(  # regression: a NUL in a writer's name failed the server write (text argument) and not the Python path
    scenario=Scenario(
        hooks=("",),
        ops=(
            Op("admit", 1, ADMIT, {"max_in_flight": 1}),
            _state(1, Rank(2, 1), "running"),
            Op("event", 1, Rank(1, 1), {"data": {}, "artifacts": 0}),
            Op("record", 1, Rank(2, 1), {"record": {"number": 1, "verdict": "failed", "reason": "x"}}),
            _state(1, Rank(3, 1), "failed", max_in_flight=1, hand_off_cap=3),
            _state(1, Rank(4, 1), "running"),
        ),
    )
)
def test_every_implementation_of_the_fenced_write_agrees(runner: Runner, scenario: Scenario) -> None:
    """The same writers in the same order through the Python path on SQLite, the Python path on PostgreSQL and
    the server-side function: the same outcomes, and the same rows, events, attempts, artifacts and outbox rows."""
    _compare(runner, scenario)


# Races: a batch of writers to one item at once. Whatever order they are serialised in, a write lower than one
# accepted before it is rejected, the mark is the highest accepted rank, a closed item stays closed, and the
# tenant's limit holds.

race_ops = st.one_of(
    st.builds(
        lambda rank, state: Op(
            "set_state",
            0,
            rank,
            {
                "state": state,
                "reason": None,
                "fields": None,
                "event_data": None,
                "attempt": None,
                "max_in_flight": 1,
                "hand_off_cap": 2,
            },
        ),
        ranks,
        st.sampled_from(STATES),
    ),
    st.builds(lambda rank: Op("admit", 0, rank, {"max_in_flight": 1}), ranks),
    st.builds(lambda rank, r: Op("record", 0, rank, {"record": r}), ranks, records),
    st.builds(lambda rank: Op("event", 0, rank, {"data": {}, "artifacts": 0}), ranks),
)


async def _race(stores: list[Store], batch: list[Op]) -> None:
    """The batch at once, the writers taking turns over `stores` (two: workers of both paths on one database)."""
    store = stores[0]
    tid, ids = await _setup(store, ("",))
    outs = await asyncio.gather(*(_apply(stores[i % len(stores)], tid, ids, op) for i, op in enumerate(batch)))
    async with store.engine.connect() as c:
        events = (
            await c.execute(
                text("SELECT type, rank, data FROM events WHERE work_item_id = :w ORDER BY id"), {"w": ids[0]}
            )
        ).all()
        mark, state = (
            await c.execute(text("SELECT fence_rank, state FROM work_items WHERE id = :w"), {"w": ids[0]})
        ).one()
        in_flight = (
            await c.execute(
                text(
                    "SELECT count(*) FROM work_items WHERE tenant_id = :t AND state IN ('admitted', 'running', "
                    "'validating', 'landing')"
                ),
                {"t": tid},
            )
        ).scalar_one()
    accepted = [op.rank.encode() for op, out in zip(batch, outs, strict=True) if out["ok"]]
    for op, out in zip(batch, outs, strict=True):
        assert out["current"] is not None
        seen = out["current"].encode()
        assert seen in (0, *accepted), "a mark no accepted write set"
        if out["ok"]:
            assert op.rank.encode() >= seen, f"a stale write won: {op!r} over {out['current']}"
        elif not out["closed"]:
            assert op.rank.encode() < seen, f"a current write was refused as stale: {op!r} under {out['current']}"
    high = 0
    closed = False
    for type_, rank, data in events:
        data = json.loads(data) if isinstance(data, str) else data
        if type_ in ("stale_write_rejected", "write_after_terminal_rejected"):
            continue
        assert rank >= high, f"a stale write won: {type_} at {Rank.decode(rank)} after {Rank.decode(high)}"
        assert not closed, f"a write after the item closed: {type_}"
        high = rank
        if type_ == "state_changed" and S(data["state"]).terminal:
            closed = True
    assert mark == max([0, *accepted]), "the mark is the highest accepted rank"
    assert in_flight <= 1 or state not in IN_FLIGHT_STATES, "the tenant's limit was exceeded"


@settings(settings.get_profile(PROFILE), max_examples=max(10, settings.get_profile(PROFILE).max_examples // 3))
@given(
    batch=st.lists(race_ops, min_size=2, max_size=6),
    impl=st.sampled_from(["python-sqlite", "python-postgres", "server-postgres", "python-postgres+server-postgres"]),
)
def test_racing_writers_never_let_a_stale_attempt_win(runner: Runner, batch: list[Op], impl: str) -> None:
    """Writers racing on one item through one implementation, or through both on one PostgreSQL database (workers
    of both kinds during a rolling change of `CREWWORK_STORE_SERVER_WRITES`)."""
    runner.run(_race([runner.stores[name] for name in impl.split("+")], batch))
