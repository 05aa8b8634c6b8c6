"""The invariant checker itself: it passes on a clean history written through the store, and fails, naming the
culprit, on each kind of hand-made bad data."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from crewwork.invariants import check_invariants
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.store import AttemptRecord, Store, work_item_fence_key
from crewwork.store.tables import Event, Lease, LeaseHistory, WorkItem

pytestmark = [pytest.mark.postgres]


async def _item(store: Store, kind: str = "task") -> tuple[str, str]:
    tid = await store.ensure_tenant("invariants")
    spec = (
        {"kind": "task", "input": {}}
        if kind == "task"
        else {
            "kind": "code_change",
            "repo": {"url": "/nowhere"},
            "instruction": "x",
            "validation": {"command": ["true"]},
        }
    )
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(spec), base_commit=None, repo_path=None
    )
    return tid, row.id


async def _clean_history(store: Store, kind: str = "task", state: WorkItemState = WorkItemState.succeeded) -> str:
    """A work item run the way the activities run it: fresh token per write, lease acquired and released."""
    tid, wid = await _item(store, kind)
    key = work_item_fence_key(wid)
    t = await store.issue_token(key)
    await store.set_state(work_item_id=wid, tenant_id=tid, token=t, state=WorkItemState.admitted, writer="admit")
    lease_token, _ = await store.acquire_lease(key, "run_agent#1", 30, supersede=True)
    assert lease_token is not None
    await store.set_state(
        work_item_id=wid, tenant_id=tid, token=lease_token, state=WorkItemState.running, writer="run_agent#1"
    )
    await store.release_lease(key, token=lease_token)
    t = await store.issue_token(key)
    await store.record_attempt(
        work_item_id=wid,
        tenant_id=tid,
        token=t,
        record=AttemptRecord(number=1, verdict="passed", reason="ok"),
        writer="record",
    )
    if kind == "code_change" and state == WorkItemState.succeeded:
        await store.append_event(wid, tid, "landed", {"commit": "c0ffee"}, token=await store.issue_token(key))
    t = await store.issue_token(key)
    await store.set_state(
        work_item_id=wid,
        tenant_id=tid,
        token=t,
        state=state,
        writer="finish",
        fields={"result": {"state": state.value}, "landed_commit": "c0ffee" if kind == "code_change" else None},
    )
    # A zombie's late write: rejected, and that is fine.
    await store.set_state(work_item_id=wid, tenant_id=tid, token=lease_token, state=WorkItemState.failed, writer="z")
    return wid


async def test_clean_history_passes_every_invariant(pg_store: Store) -> None:
    ids = [
        await _clean_history(pg_store),
        await _clean_history(pg_store, "code_change"),
        await _clean_history(pg_store, "code_change", WorkItemState.failed),
    ]
    report = await check_invariants(pg_store, ids)
    assert report.ok, str(report)


async def test_non_terminal_item_fails_terminal_unless_in_flight_is_allowed(pg_store: Store) -> None:
    _tid, wid = await _item(pg_store)
    report = await check_invariants(pg_store, [wid])
    assert report.failed() == ["terminal"] and report.non_terminal == [f"{wid}: submitted"]
    assert (await check_invariants(pg_store, [wid], require_terminal=False)).ok


async def test_older_write_accepted_after_newer_one_fails_monotonic_and_result_token(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    row = await pg_store.get_work_item(wid)
    assert row is not None and row.result_token is not None
    async with pg_store.session() as s:
        # What a broken fence would let through: a zombie's write with an old token, after the result.
        s.add(
            Event(
                work_item_id=wid,
                tenant_id=row.tenant_id,
                type="state_changed",
                data={"state": "failed"},
                token=row.result_token - 3,
                created_at=0,
            )
        )
    report = await check_invariants(pg_store, [wid])
    assert "monotonic_writes" in report.failed()
    assert any(f"token {row.result_token - 3} after" in d for d in report.results["monotonic_writes"].details)


async def test_result_stored_with_an_old_token_fails_result_token(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    async with pg_store.session() as s:
        await s.execute(update(WorkItem).where(WorkItem.id == wid).values(result_token=1))
    report = await check_invariants(pg_store, [wid])
    assert report.failed() == ["result_token"]
    assert "stored result has token 1" in report.results["result_token"].details[0]


async def test_two_accepted_writes_sharing_a_token_fail_unique_tokens(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    events = [e for e in await pg_store.list_events(wid) if e.type == "attempt_recorded"]
    async with pg_store.session() as s:
        s.add(
            Event(
                work_item_id=wid,
                tenant_id=events[0].tenant_id,
                type="attempt_recorded",
                data={"number": 1},
                token=events[0].token,
                created_at=0,
            )
        )
    report = await check_invariants(pg_store, [wid])
    assert "unique_tokens" in report.failed()


async def test_overlapping_lease_grants_fail_lease_exclusive(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    key = work_item_fence_key(wid)
    async with pg_store.session() as s:
        s.add(LeaseHistory(key=key, holder="a", token=1000, acquired_at=10.0, ended_at=20.0, end_reason="released"))
        s.add(LeaseHistory(key=key, holder="b", token=1001, acquired_at=15.0, ended_at=25.0, end_reason="released"))
    report = await check_invariants(pg_store, [wid])
    assert report.failed() == ["lease_exclusive"]
    assert "overlapping b (token 1001)" in report.results["lease_exclusive"].details[0]


async def test_lease_still_held_by_a_finished_item_fails_no_lease_held(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    async with pg_store.session() as s:
        s.add(Lease(key=work_item_fence_key(wid), holder="run_agent#9", token=10**9, acquired_at=0, expires_at=1))
    report = await check_invariants(pg_store, [wid])
    assert report.failed() == ["no_lease_held"]


async def test_landing_counts_fail_one_landing(pg_store: Store) -> None:
    twice = await _clean_history(pg_store, "code_change")
    failed = await _clean_history(pg_store, "code_change", WorkItemState.failed)
    never = await _clean_history(pg_store, "code_change")
    for wid in (twice, failed):
        row = await pg_store.get_work_item(wid)
        assert row is not None
        await pg_store.append_event(wid, row.tenant_id, "landed", {"commit": "c0ffee"})
    async with pg_store.session() as s:
        from sqlalchemy import delete

        await s.execute(delete(Event).where(Event.work_item_id == never, Event.type == "landed"))
    report = await check_invariants(pg_store, [twice, failed, never])
    assert report.failed() == ["one_landing"]
    details = " | ".join(report.results["one_landing"].details)
    assert f"{twice} succeeded with 2 landed events" in details
    assert f"{failed} is failed (code_change) but has 1 landed event(s)" in details
    assert f"{never} succeeded with 0 landed events" in details
