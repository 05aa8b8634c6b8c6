"""The reconciler (crewwork/admission/reconcile.py) on a real Temporal dev server, real PostgreSQL and real pools: an item
whose workflow an operator terminated stops holding its tenant's place, its workspace lease and its worktree, and
nothing the terminated workflow's attempts write afterwards is accepted."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from crewwork.admission.reconcile import CLOSED_WORKFLOW, Reconciler
from crewwork.admission.starts import ADMISSION
from crewwork.cli.demo import RIGHT
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.fencing import FencedWrite, Rank, StateChange
from crewwork.store.tables import Event, Lease
from crewwork.temporal.devserver import DevServer
from tests.conftest import Crew, make_settings, running_crew
from tests.integration.test_lifecycle import code_change
from tests.invariants import check_invariants

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def _task(delay_s: float) -> dict[str, object]:
    return {"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {"output": {}, "delay_s": delay_s}}}


async def test_a_terminated_item_is_closed_and_its_place_goes_to_the_queue(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url, tenant_max_in_flight=1, reconcile_interval_s=0)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        stuck = await crew.submit(_task(4.0))
        row = await crew.wait_state(stuck, "running")
        behind = await crew.submit(_task(0.0))
        await crew.wait_state(behind, "queued")
        await crew.client.get_workflow_handle(row.workflow_id).terminate(reason="operator:  the model hangs\n")

        rec = Reconciler(crew.store, crew.client, settings)
        # Items younger than the minimum age are not looked at (a workflow may still be starting).
        # (The database is shared with other tests: only this test's items are asserted on.)
        young = await rec.run_cycle(min_age_s=3600)
        assert stuck not in young.closed and (await crew.store.get_work_item(stuck)).state == "running"  # type: ignore[union-attr]
        res = await rec.run_cycle(min_age_s=0)
        assert stuck in res.closed and behind not in res.closed + res.unknown, res
        closed = await crew.store.get_work_item(stuck)
        assert closed is not None and closed.state == "dead"
        assert closed.reason == "its workflow was terminated: operator: the model hangs", closed.reason
        assert closed.fence_rank == CLOSED_WORKFLOW.encode()
        assert (closed.result or {}).get("state") == "dead"
        # The place went to the queued item in the reconciler's write, and it was told (not left to its timer).
        assert (await crew.result(behind, timeout_s=60)).state == "succeeded"
        handed = [e for e in await crew.store.list_events(behind) if e.data.get("state") == "admitted"]
        assert [e.data["writer"] for e in handed] == [f"hand_off from {stuck}"], handed

        # The terminated workflow's agent attempt is still running in the pool; whatever it writes when it ends is
        # refused, and the item stays dead.
        await asyncio.sleep(5)
        after = [
            e for e in await crew.store.list_events(stuck) if e.id > _reconciled(await crew.store.list_events(stuck))
        ]
        assert all(e.type == "write_after_terminal_rejected" for e in after), [e.type for e in after]
        # Whether that attempt still wrote depends on when its heartbeat noticed the end; a late write of the
        # workflow's next step (above every rank it scheduled) is refused whatever it is.
        late = await crew.store.set_state(
            StateChange(
                FencedWrite(
                    work_item_id=stuck,
                    tenant_id=crew.tenant_id,
                    rank=Rank(step=row.fence_rank // Rank.SPAN + 1, attempt=1),
                    writer="run_agent#zombie",
                ),
                state=WorkItemState.running,
            )
        )
        assert not late.ok and late.current == CLOSED_WORKFLOW, late  # refused as stale: below the close
        assert (await crew.store.get_work_item(stuck)).state == "dead"  # type: ignore[union-attr]
        (await check_invariants(crew.store, [stuck, behind])).assert_ok()
        # A second pass finds nothing to do.
        again = await rec.run_cycle(min_age_s=0)
        assert stuck not in again.closed and behind not in again.closed, again


ORPHAN = Rank(step=1, attempt=1)


async def _orphan(crew: Crew, spec: WorkItemSpec) -> str:
    """An item its workflow's first step moved to `running`, whose workflow Temporal does not know."""
    row, _ = await crew.store.create_work_item(tenant_id=crew.tenant_id, spec=spec, base_commit=None, repo_path=None)
    res = await crew.store.set_state(
        StateChange(
            FencedWrite(work_item_id=row.id, tenant_id=crew.tenant_id, rank=ORPHAN, writer="test"),
            state=WorkItemState.running,
        )
    )
    assert res.ok, res
    return row.id


async def test_items_admitted_before_their_workflow_are_started_when_their_start_was_lost(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """Admission is decided before the workflow starts (crewwork/admission/starts.py); a process that dies between the store's
    write and the start leaves an item with no workflow: submitted (the API died after the insert), admitted (after
    the admission or a hand-off) or queued with a place free. The reconciler admits it if it is not (first come,
    first served) and starts it admitted; one whose tenant is at its limit stays queued, with no workflow, until an
    ending item hands it its place."""
    settings = make_settings(tmp_path, temporal_server, pg_url, tenant_max_in_flight=2, reconcile_interval_s=0)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        spec = WorkItemSpec.model_validate(_task(0))
        rec = Reconciler(crew.store, crew.client, settings)

        async def row() -> str:
            r, _ = await crew.store.create_work_item(
                tenant_id=crew.tenant_id, spec=spec, base_commit=None, repo_path=None
            )
            return r.id

        submitted = await row()
        admitted = await row()
        await _admitted_unstarted(crew, admitted)
        res = await rec.run_cycle(min_age_s=0)
        assert {submitted, admitted} <= set(res.started), res
        for wid in (submitted, admitted):
            assert (await crew.result(wid, timeout_s=60)).state == "succeeded"
        # A second pass: both have their workflow (closed), nothing is started twice.
        again = await rec.run_cycle(min_age_s=0)
        assert not {submitted, admitted} & set(again.started + again.unknown), again

        # The tenant at its limit (two long items), an item submitted with no workflow stays queued...
        holders = [await crew.submit(_task(3.0)) for _ in range(2)]
        for h in holders:
            await crew.wait_state(h, "running")
        waiting = await row()
        res = await rec.run_cycle(min_age_s=0)
        assert waiting not in res.started + res.unknown and res.queued >= 1, res
        stored = await crew.store.get_work_item(waiting)
        assert stored is not None and stored.state == "queued"
        # ... until an ending item hands it its place, and its workflow starts admitted.
        assert (await crew.result(waiting, timeout_s=60)).state == "succeeded"
        handed = [e for e in await crew.store.list_events(waiting) if e.data.get("state") == "admitted"]
        assert len(handed) == 1 and handed[0].data["writer"].startswith("hand_off from "), handed
        # The other holder may still be running (the waiting item takes the first freed place, and runs in no time):
        # the invariants want every item ended.
        for h in holders:
            assert (await crew.result(h, timeout_s=60)).state == "succeeded"
        (await check_invariants(crew.store, [submitted, admitted, waiting, *holders])).assert_ok()


async def _admitted_unstarted(crew: Crew, work_item_id: str) -> None:
    """What a process that died between an admission (crewwork/admission/starts.py) and its workflow's start leaves: the item
    admitted at rank ADMISSION, and no workflow."""

    async def no_fingerprints(_s: object, _wid: str) -> list[str | None]:
        return []

    adm = await crew.store.admit(
        FencedWrite(work_item_id=work_item_id, tenant_id=crew.tenant_id, rank=ADMISSION, writer="admission"),
        max_in_flight=crew.settings.tenant_max_in_flight,
        fingerprints=no_fingerprints,
    )
    assert adm.ok and adm.value is not None and adm.value.admitted, adm


def _reconciled(events: list[Event]) -> int:
    return next(e.id for e in events if e.type == "state_changed" and e.data.get("writer") == "reconciler")


async def test_a_terminated_item_in_review_frees_its_workspace(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    settings = make_settings(
        tmp_path / "crew", temporal_server, pg_url, sandbox_backend=sandbox_backend, reconcile_interval_s=0
    )
    async with running_crew(settings) as crew:
        steps = [{"files": {"calc.py": RIGHT}}]
        first = await crew.submit(code_change(calc_repo, steps, review={"required": True}))
        row = await crew.wait_state(first, "awaiting_review", timeout_s=120)
        held = await _leases(crew, first)
        assert held, "an item awaiting review holds its workspace lease"
        # The next item on the same branch waits for that lease (up to an hour while the first awaits review).
        second = await crew.submit(code_change(calc_repo, steps, review={"required": True}))
        await crew.client.get_workflow_handle(row.workflow_id).terminate(reason="abandoned")
        res = await Reconciler(crew.store, crew.client, settings).run_cycle(min_age_s=0)
        assert first in res.closed, res
        assert await _leases(crew, first) == []
        assert not (settings.resolved_worktree_dir() / first).exists()
        await crew.wait_state(second, "awaiting_review", timeout_s=120)
        (await check_invariants(crew.store, [first])).assert_ok()


async def _leases(crew: Crew, holder: str) -> list[str]:
    async with crew.store.session() as s:
        return list((await s.scalars(select(Lease.key).where(Lease.holder == holder))).all())


async def test_items_without_a_workflow_are_left_alone_and_passes_go_round(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url, reconcile_interval_s=0)
    async with running_crew(settings, pools=()) as crew:
        spec = WorkItemSpec.model_validate(_task(0))
        # Rows past admission whose workflow Temporal does not know (retention removed it, another namespace).
        ids = [await _orphan(crew, spec) for _ in range(3)]
        rec = Reconciler(crew.store, crew.client, settings)
        mine = set(ids)
        seen: list[str] = []
        # Other tests' open items share the database: walk until this test's three were each seen twice.
        for _ in range(1000):
            res = await rec.run_once(batch=2, min_age_s=0)
            assert res.errors == 0, res
            seen += [i for i in res.unknown if i in mine]
            if all(seen.count(i) >= 2 for i in ids):
                break
        else:
            raise AssertionError(f"passes never came round: {seen}")
        assert seen[:3] == ids, "submission order"
        for wid in ids:
            row = await crew.store.get_work_item(wid)
            assert row is not None and row.state == "running" and row.fence_rank == ORPHAN.encode()


async def test_close_unknown_ends_the_items_a_restored_store_holds_without_workflows(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """After restoring crewwork's store without Temporal's history (docs/operations.md, "Backups"), items past their
    workflow's first write have no workflow: left alone by every pass, ended `dead` by `--close-unknown` (the
    operator's decision), after which nothing their lost workflow could write is accepted."""
    settings = make_settings(tmp_path, temporal_server, pg_url, reconcile_interval_s=0)
    async with running_crew(settings, pools=()) as crew:
        spec = WorkItemSpec.model_validate(_task(0))
        ids = [await _orphan(crew, spec) for _ in range(2)]
        rec = Reconciler(crew.store, crew.client, settings)
        left = await rec.run_cycle(batch=50, min_age_s=0)
        assert set(ids) <= set(left.unknown) and not set(ids) & set(left.closed), left
        closed = await rec.run_cycle(batch=50, min_age_s=0, close_unknown=True)
        assert set(ids) <= set(closed.closed) and not set(ids) & set(closed.unknown), closed
        for wid in ids:
            row = await crew.store.get_work_item(wid)
            assert row is not None and row.state == "dead", row
            assert "is not in Temporal" in (row.reason or ""), row.reason
            late = await crew.store.set_state(
                StateChange(FencedWrite(wid, crew.tenant_id, Rank(step=50, attempt=1), "test"), WorkItemState.running)
            )
            assert not late.ok, "a write of the lost workflow after the close is refused"


async def test_the_reconcile_command_runs_one_pass(tmp_path: Path, temporal_server: DevServer, pg_url: str) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url)
    async with running_crew(settings, pools=()) as crew:
        spec = WorkItemSpec.model_validate(_task(0))
        rows = [await _orphan(crew, spec) for _ in range(3)]
    env = {
        **os.environ,
        "CREWWORK_DATABASE_URL": pg_url,
        "CREWWORK_TEMPORAL_ADDRESS": temporal_server.address,
        "CREWWORK_DATA_DIR": str(tmp_path),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crewwork", "reconcile", "--json", "--min-age", "0", "--batch", "2",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    got = json.loads(out)
    # One page of 2 at a time, through every open item (not only the first page, again and again).
    assert all(r in got["unknown"] for r in rows) and got["checked"] >= 3 and got["errors"] == 0, got


async def test_a_stream_of_new_items_does_not_keep_a_cycle_from_ending(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """More open items arrive per pass than a pass reads (a tenant submitting fast): the cycle still ends and starts
    over at the oldest, so an item terminated behind the cursor is reached. Before, the cursor only started over
    when a pass came up short, which a steady stream of new items never let happen."""
    settings = make_settings(tmp_path, temporal_server, pg_url, reconcile_interval_s=0)
    async with running_crew(settings, pools=()) as crew:
        spec = WorkItemSpec.model_validate(_task(0))

        async def submitted() -> str:
            return await _orphan(crew, spec)

        oldest = await submitted()
        rec = Reconciler(crew.store, crew.client, settings)
        seen = 0
        for _pass in range(5000):
            for _ in range(3):
                await submitted()
            res = await rec.run_once(batch=2, min_age_s=0)
            seen += res.unknown.count(oldest)
            if seen == 2:
                break
        else:
            raise AssertionError("the cycle never ended: the first item was not looked at a second time")


async def test_a_lost_start_after_an_admission_is_made_before_the_minimum_age(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """An item admitted (by its submission or a hand-off) whose workflow start never came holds one of its tenant's
    places: every pass checks such items once they are UNSTARTED_AFTER_S old, without waiting for the cycle's
    minimum age (300 s by default)."""
    settings = make_settings(tmp_path, temporal_server, pg_url, reconcile_interval_s=0)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        spec = WorkItemSpec.model_validate(_task(0))
        row, _ = await crew.store.create_work_item(
            tenant_id=crew.tenant_id, spec=spec, base_commit=None, repo_path=None
        )
        await _admitted_unstarted(crew, row.id)
        rec = Reconciler(crew.store, crew.client, settings)
        # Younger than the check's age, and than the cycle's: left alone.
        young = await rec.run_once(min_age_s=3600, unstarted_after_s=3600)
        assert row.id not in young.started + young.unknown, young
        res = await rec.run_once(min_age_s=3600, unstarted_after_s=0)
        assert row.id in res.started, res
        assert (await crew.result(row.id, timeout_s=60)).state == "succeeded"
        again = await rec.run_once(min_age_s=3600, unstarted_after_s=0)
        assert row.id not in again.started, again
