"""The invariant checker itself: it passes on a clean history written through the store, and fails, naming the
culprit, on each kind of bad data a broken store or a zombie could leave (written here by hand, bypassing fencing)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.fencing import FencedWrite, StateChange
from crewwork.store.store import AttemptRecord, Rank, Store
from crewwork.store.tables import Event, Lease, LeaseHistory, WorkItem
from tests.invariants import CompletedStep, check_invariants
from tests.repos.servers import Listener

pytestmark = [pytest.mark.postgres]

CODE_CHANGE = {"kind": "code_change", "repo": {"url": "/nowhere"}, "instruction": "x", "validation": {"command": ["t"]}}


async def _item(store: Store, kind: str = "task") -> tuple[str, str]:
    tid = await store.ensure_tenant("invariants")
    spec = {"kind": "task", "input": {}} if kind == "task" else CODE_CHANGE
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate(spec), base_commit=None, repo_path=None
    )
    return tid, row.id


async def _clean_history(store: Store, kind: str = "task", state: WorkItemState = WorkItemState.succeeded) -> str:
    """A work item run the way the workflow runs it: one step after another, an agent step retried once."""
    tid, wid = await _item(store, kind)
    w: dict[str, Any] = {"work_item_id": wid, "tenant_id": tid}
    await store.set_state(
        StateChange(FencedWrite(**w, rank=Rank(1, 1), writer="admit#1"), state=WorkItemState.admitted)
    )
    await store.set_state(
        StateChange(
            FencedWrite(**w, rank=Rank(2, 1), writer="run_agent#1"),
            state=WorkItemState.running,
            event_data={"attempt": 1},
        )
    )
    await store.set_state(
        StateChange(
            FencedWrite(**w, rank=Rank(2, 2), writer="run_agent#2"),
            state=WorkItemState.running,
            event_data={"attempt": 1},
        )
    )
    await store.fenced_event(
        FencedWrite(**w, rank=Rank(2, 2), writer="run_agent#2"),
        type_="agent_finished",
        data={"attempt": 1, "diff_ref": "art_1"},
    )
    await store.record_attempt(
        FencedWrite(**w, rank=Rank(3, 1), writer="record#1"),
        record=AttemptRecord(number=1, verdict="passed", reason="ok", agent={"diff_ref": {"id": "art_1"}}),
    )
    if kind == "code_change" and state == WorkItemState.succeeded:
        await store.fenced_event(
            FencedWrite(**w, rank=Rank(4, 1), writer="land#1"), type_="landed", data={"commit": "c0ffee"}
        )
    await store.set_state(
        StateChange(
            FencedWrite(**w, rank=Rank(5, 1), writer="finish#1"),
            state=state,
            fields={"result": {"state": state.value}, "landed_commit": "c0ffee" if kind == "code_change" else None},
        )
    )
    # A zombie's late writes: rejected, and that is fine.
    await store.set_state(
        StateChange(FencedWrite(**w, rank=Rank(2, 1), writer="run_agent#1"), state=WorkItemState.failed)
    )
    await store.set_state(StateChange(FencedWrite(**w, rank=Rank(9, 1), writer="late"), state=WorkItemState.running))
    return wid


async def _event(store: Store, wid: str, type_: str, rank: Rank, **data: Any) -> None:
    async with store.session() as s:
        s.add(Event(work_item_id=wid, tenant_id="t", type=type_, data=data, rank=rank.encode(), created_at=1.0))


async def test_clean_history_passes_every_invariant(pg_store: Store) -> None:
    wids = [
        await _clean_history(pg_store, "task"),
        await _clean_history(pg_store, "code_change"),
        await _clean_history(pg_store, "code_change", WorkItemState.failed),
    ]
    histories = {wids[0]: [CompletedStep("run_agent", 2, 2)]}
    report = await check_invariants(pg_store, wids, check_git=False, histories=histories)
    report.assert_ok()
    assert report.counts["stale_rejected"] == 3 and report.counts["after_terminal_rejected"] == 3
    assert report.counts.get("stale_accepted", 0) == 0 and report.counts.get("state_regressions", 0) == 0


async def test_non_terminal_item_fails_terminal_unless_in_flight_is_allowed(pg_store: Store) -> None:
    _, wid = await _item(pg_store)
    assert (await check_invariants(pg_store, [wid])).failed() == ["terminal"]
    assert (await check_invariants(pg_store, [wid], require_terminal=False)).ok


async def test_an_older_write_accepted_after_a_newer_one_fails_monotonic_writes(pg_store: Store) -> None:
    """What the issue's zombie did: attempt 1 of step 2 wrote after step 5 had (a store that ranked by arrival)."""
    wid = await _clean_history(pg_store)
    await _event(pg_store, wid, "agent_finished", Rank(2, 1), attempt=1, diff_ref="art_zombie")
    report = await check_invariants(pg_store, [wid])
    assert "monotonic_writes" in report.failed() and report.counts["stale_accepted"] == 1
    assert "outcome_agreement" in report.failed(), "the events now name the zombie's diff, the record the retry's"


async def test_a_state_that_goes_backwards_fails_state_forward(pg_store: Store) -> None:
    tid, wid = await _item(pg_store, "code_change")
    w: dict[str, Any] = {"work_item_id": wid, "tenant_id": tid, "writer": "x"}
    await pg_store.set_state(
        StateChange(FencedWrite(**w, rank=Rank(1, 1)), state=WorkItemState.running, event_data={"attempt": 1})
    )
    await pg_store.set_state(
        StateChange(FencedWrite(**w, rank=Rank(2, 1)), state=WorkItemState.awaiting_review, event_data={"attempt": 1})
    )
    await pg_store.set_state(
        StateChange(FencedWrite(**w, rank=Rank(3, 1)), state=WorkItemState.running, event_data={"attempt": 1})
    )
    report = await check_invariants(pg_store, [wid], require_terminal=False)
    assert report.failed() == ["state_forward"] and report.counts["state_regressions"] == 1


async def test_a_request_for_changes_moves_forward_to_the_next_attempt(pg_store: Store) -> None:
    tid, wid = await _item(pg_store, "code_change")
    w: dict[str, Any] = {"work_item_id": wid, "tenant_id": tid, "writer": "x"}
    for step, (state, attempt) in enumerate(
        [("running", 1), ("validating", 1), ("awaiting_review", 1), ("running", 2), ("validating", 2)], start=1
    ):
        await pg_store.set_state(
            StateChange(
                FencedWrite(**w, rank=Rank(step, 1)), state=WorkItemState(state), event_data={"attempt": attempt}
            )
        )
    assert (await check_invariants(pg_store, [wid], require_terminal=False)).ok


async def test_a_result_stored_below_the_mark_fails_fence_mark(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    async with pg_store.session() as s:
        await s.execute(update(WorkItem).where(WorkItem.id == wid).values(result_rank=Rank(1, 1).encode()))
    assert (await check_invariants(pg_store, [wid])).failed() == ["fence_mark"]


async def test_queued_items_that_asked_again_pass_while_in_flight(pg_store: Store, tmp_path: Any) -> None:
    """A queued item's admission that keeps it queued, or finds it admitted already (a place was handed to it and
    the signal was lost), is an accepted write that raises the mark and changes nothing else: no event. Checked
    while work is in flight, that is not a violation (it failed `fence_mark`); a mark below an accepted write is."""
    from crewwork.config import Settings
    from crewwork.models import WorkItemResult
    from crewwork.steps.admit import AdmitInput
    from crewwork.steps.finish import FinishInput
    from crewwork.steps.ports import Ports
    from crewwork.steps.registry import bound

    control = bound(Ports.build(pg_store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    spec = WorkItemSpec.model_validate({"kind": "task", "input": {}})
    tid = await pg_store.ensure_tenant("invariants-queue")  # its own tenant: the others' items stay in flight
    items = [
        (tid, (await pg_store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None))[0].id)
        for _ in range(3)
    ]
    for _t, w in items:
        await control.admit(AdmitInput(work_item_id=w, tenant_id=tid, step=1, spec=spec))
    first, second, third = (w for _t, w in items)
    await control.admit(AdmitInput(work_item_id=third, tenant_id=tid, step=2, spec=spec))  # a poll: still queued
    result = WorkItemResult(work_item_id=first, state=WorkItemState.succeeded, reason="done")
    await control.finish(FinishInput(work_item_id=first, tenant_id=tid, step=2, result=result))
    assert (await control.admit(AdmitInput(work_item_id=second, tenant_id=tid, step=2, spec=spec))).admitted
    report = await check_invariants(pg_store, [first, second, third], require_terminal=False)
    report.assert_ok()
    async with pg_store.session() as s:
        await s.execute(update(WorkItem).where(WorkItem.id == second).values(fence_rank=Rank(0, 5).encode()))
    assert (await check_invariants(pg_store, [second], require_terminal=False)).failed() == ["fence_mark"]


async def test_an_unjustified_rejection_fails_rejections_justified(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    async with pg_store.session() as s:
        s.add(
            Event(
                work_item_id=wid,
                tenant_id="t",
                type="stale_write_rejected",
                data={"presented": {"step": 9, "attempt": 1}, "current": {"step": 5, "attempt": 1}},
                rank=Rank(9, 1).encode(),
                created_at=2.0,
            )
        )
    assert (await check_invariants(pg_store, [wid])).failed() == ["rejections_justified"]


async def test_an_outcome_from_an_attempt_temporal_did_not_accept_fails_temporal_agreement(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    report = await check_invariants(pg_store, [wid], histories={wid: [CompletedStep("run_agent", 2, 3)]})
    assert report.failed() == ["temporal_agreement"]


async def test_overlapping_lease_grants_fail_lease_exclusive(pg_store: Store) -> None:
    tid, wid = await _item(pg_store)
    key = f"ws:/overlap-{wid}#main"
    await pg_store.fenced_event(
        FencedWrite(work_item_id=wid, tenant_id=tid, rank=Rank(1, 1), writer="w"),
        type_="workspace_acquired",
        data={"key": key},
    )
    async with pg_store.session() as s:
        s.add(LeaseHistory(key=key, holder="a", token=1000, acquired_at=10.0, ended_at=20.0, end_reason="released"))
        s.add(LeaseHistory(key=key, holder="b", token=1001, acquired_at=15.0, ended_at=25.0, end_reason="released"))
    assert "lease_exclusive" in (await check_invariants(pg_store, [wid], require_terminal=False)).failed()


async def test_lease_still_held_by_a_finished_item_fails_no_lease_held(pg_store: Store) -> None:
    wid = await _clean_history(pg_store)
    async with pg_store.session() as s:
        s.add(Lease(key=f"ws:/held-{wid}#main", holder=wid, token=10**9, acquired_at=0, expires_at=10**12))
    assert (await check_invariants(pg_store, [wid])).failed() == ["no_lease_held"]


async def test_landing_counts_fail_one_landing(pg_store: Store) -> None:
    twice = await _clean_history(pg_store, "code_change")
    await _event(pg_store, twice, "landed", Rank(5, 1), commit="c0ffee")
    never = await _clean_history(pg_store, "code_change", WorkItemState.failed)
    await _event(pg_store, never, "landed", Rank(5, 1), commit="bad")
    report = await check_invariants(pg_store, [twice, never])
    assert "one_landing" in report.failed()
    assert any(twice in d for d in report.results["one_landing"].details)
    assert any(never in d for d in report.results["one_landing"].details)


async def test_check_git_reads_a_remote_as_host_git_does_under_the_address_policy(
    pg_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check_git` lists the delivery branch of a tenant-named remote: it is a network git command like the
    workers', so the remote's host passes the operator's address policy first (CREWWORK_REPO_ALLOW_NETWORKS) and
    nothing is dialled when it does not. Here the stored URL names this host's loopback, and the policy is the
    production default (public addresses only): the checker says it cannot read the branch, and the listener on
    that address sees no connection."""
    monkeypatch.setenv("CREWWORK_REPO_ALLOW_NETWORKS", "")
    wid = await _clean_history(pg_store, "code_change")
    with Listener("127.0.0.1") as internal:
        async with pg_store.session() as s:
            await s.execute(
                update(WorkItem)
                .where(WorkItem.id == wid)
                .values(repo_url=f"git://127.0.0.1:{internal.port}/acme/calc.git", delivery_branch=f"crewwork/{wid}")
            )
        report = await check_invariants(pg_store, [wid], check_git=True)
        assert internal.connections == 0, "the checker's git dialled an address the operator did not allow"
    assert report.failed() == ["one_landing"]
    assert any("loopback" in d and "CREWWORK_REPO_ALLOW_NETWORKS" in d for d in report.results["one_landing"].details)
