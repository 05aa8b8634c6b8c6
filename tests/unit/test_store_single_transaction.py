"""The one-transaction forms of the fenced write, on SQLite and on PostgreSQL: a token issued inside the write, the
execution lease taken and released with the attempt's first and last writes, admission, and a result written with
its attempt record."""

from __future__ import annotations

from crewwork.activities.common import FirstWrite, execution_lease, record_step
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.store import AttemptRecord, Store, work_item_fence_key


async def _item(store: Store) -> tuple[str, str]:
    tid = await store.ensure_tenant("one-txn")
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate({"kind": "task", "input": {}}), base_commit=None, repo_path=None
    )
    return tid, row.id


def _first(tenant_id: str, writer: str) -> FirstWrite:
    return FirstWrite(tenant_id=tenant_id, state=WorkItemState.running, reason="start", writer=writer, event_data={})


async def test_a_write_that_issues_its_token_is_newest_and_supersedes_older_tokens(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    old = await any_store.issue_token(work_item_fence_key(wid))
    res = await any_store.set_state(
        work_item_id=wid, tenant_id=tid, token=None, state=WorkItemState.running, writer="control"
    )
    assert res.ok and res.token is not None and res.token > old
    late = await any_store.set_state(
        work_item_id=wid, tenant_id=tid, token=old, state=WorkItemState.failed, writer="zombie"
    )
    assert late.stale and late.current_token == res.token
    assert (await any_store.get_work_item(wid)).state == "running"  # type: ignore[union-attr]


async def test_a_write_to_an_item_not_in_the_store_is_rejected_as_missing(any_store: Store) -> None:
    tid, _ = await _item(any_store)
    res = await any_store.set_state(
        work_item_id="wi_nope", tenant_id=tid, token=None, state=WorkItemState.running, writer="x"
    )
    assert not res.ok and res.missing


async def test_execution_lease_is_taken_with_the_first_write_and_released_with_the_last(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    key = work_item_fence_key(wid)

    async with execution_lease(any_store, wid, 60, first=_first(tid, "a")) as lease:
        assert lease.started is not None and lease.started.ok
        held = await any_store.get_lease(key)
        assert held is not None and held.token == lease.token == lease.started.token
        done = await record_step(lease, tid, "agent_finished", {"attempt": 1}, writer="a", release=True)
        assert done.ok and lease.released
        assert await any_store.get_lease(key) is None, "the last write released the lease in its transaction"
    types = [e.type for e in await any_store.list_events(wid)]
    assert types.count("agent_finished") == 1 and "stale_write_rejected" not in types


async def test_a_superseded_attempt_keeps_no_lease_and_its_last_write_releases_nothing(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    key = work_item_fence_key(wid)

    async with execution_lease(any_store, wid, 60, first=_first(tid, "zombie")) as zombie:
        async with execution_lease(any_store, wid, 60, first=_first(tid, "newer")) as newer:
            assert newer.token > zombie.token
            late = await record_step(zombie, tid, "agent_finished", {"by": "zombie"}, writer="zombie", release=True)
            assert late.stale and not zombie.released
            held = await any_store.get_lease(key)
            assert held is not None and held.token == newer.token, "the zombie's write must not release the newer lease"
            done = await record_step(newer, tid, "agent_finished", {"by": "newer"}, writer="newer", release=True)
            assert done.ok
    finished = [e.data for e in await any_store.list_events(wid) if e.type == "agent_finished"]
    assert finished == [{"by": "newer"}]


async def test_admission_moves_only_a_submitted_item_and_reports_a_closed_one(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    first = await any_store.admit(work_item_id=wid, tenant_id=tid, writer="admit")
    assert first.ok and first.value == [] and first.state == "submitted"
    await any_store.set_state(work_item_id=wid, tenant_id=tid, token=None, state=WorkItemState.running, writer="r")
    again = await any_store.admit(work_item_id=wid, tenant_id=tid, writer="admit")  # a continued run re-admits
    assert again.ok and (await any_store.get_work_item(wid)).state == "running"  # type: ignore[union-attr]
    await any_store.set_state(work_item_id=wid, tenant_id=tid, token=None, state=WorkItemState.failed, writer="f")
    closed = await any_store.admit(work_item_id=wid, tenant_id=tid, writer="admit")
    assert closed.closed and closed.state == "failed"
    missing = await any_store.admit(work_item_id="wi_nope", tenant_id=tid, writer="admit")
    assert missing.missing
    admitted = [e for e in await any_store.list_events(wid) if e.data.get("state") == "admitted"]
    assert len(admitted) == 1


async def test_a_result_and_its_attempt_record_are_one_write_under_one_token(any_store: Store) -> None:
    tid, wid = await _item(any_store)
    res = await any_store.set_state(
        work_item_id=wid,
        tenant_id=tid,
        token=None,
        state=WorkItemState.succeeded,
        reason="task completed",
        writer="finish",
        fields={"result": {"ok": True}},
        record=AttemptRecord(number=1, verdict="passed", reason="agent returned its output", agent={"a": 1}),
    )
    assert res.ok
    (attempt,) = await any_store.list_attempts(wid)
    row = await any_store.get_work_item(wid)
    assert row is not None and attempt.token == row.result_token == res.token
    assert (attempt.verdict, row.state, row.attempt_count) == ("passed", "succeeded", 1)


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
            work_item_id=wid, tenant_id=tid, token=None, state=WorkItemState.running, writer="after-kill"
        )
        assert res.ok
        changes = [e for e in await store.list_events(wid) if e.type == "state_changed"]
        assert [e.data["state"] for e in changes] == ["running"]
        art = await store.put_artifact(work_item_id=wid, tenant_id=tid, name="t.txt", data=b"x")
        assert (await store.artifact_content(art.id)) == b"x"
    finally:
        await store.close()


async def test_an_execution_attempt_for_an_item_not_in_the_store_is_bad_input(any_store: Store) -> None:
    import pytest
    from temporalio.exceptions import ApplicationError

    tid, _ = await _item(any_store)
    with pytest.raises(ApplicationError) as err:
        async with execution_lease(any_store, "wi_nope", 60, first=_first(tid, "a")):
            pass
    assert err.value.type == "BadInput"
