"""Fencing and recovery under real faults: a zombie activity attempt, SIGKILLed pool processes, a restarted Temporal
server, PostgreSQL connections terminated mid-run, contention for one branch, cancellation, and retries running out
(zombies that freeze before their first write: tests/reliability/test_zombies.py). Real Temporal dev server, real PostgreSQL, real git, real bubblewrap; every test ends with the
invariant checker (tests/invariants.py)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import is_cancelled_exception

from crewwork.cli.demo import RIGHT
from crewwork.models import ReviewDecision, WorkItemResult
from crewwork.store.engine import store_unreachable
from crewwork.store.store import Rank, Store
from crewwork.store.tables import Lease, LeaseHistory
from crewwork.temporal.devserver import DevServer, free_port
from tests.conftest import Crew, make_repo, make_settings, running_crew
from tests.invariants import check_invariants, completed_steps
from tests.reliability.conftest import pool_processes

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

VALIDATION = {
    "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
    "test_files": ["tests/test_calc.py"],
}


def code_change(repo: Path, step: dict[str, Any], **kw: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": [step]}},
        "budget": {"max_attempts": 1},
    }
    item.update(kw)
    return item


def calc(path: Path) -> Path:
    from crewwork.cli.demo import BUGGY, TEST

    return make_repo(path, {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


async def until(what: str, probe: Any, timeout_s: float = 90, every_s: float = 0.2) -> Any:
    """Poll `probe()` until it returns something truthy; database errors while polling count as 'not yet'."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
        except Exception as exc:  # a fault this test injects may break a probe too
            last = exc
        else:
            if last:
                return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


async def terminal(crew: Crew, wid: str, timeout_s: float = 120) -> Any:
    """The work item's final row, once its workflow has closed (so release and cleanup have run too). The test's own
    reads go through the store the in-process pools use: a test that kills the database's connections kills them too,
    mid-read; such a read is the observer's, not the system's, and is asked again (`until` does so for the probes)."""

    async def probe() -> Any:
        row = await crew.store.get_work_item(wid)
        return row if row is not None and row.result is not None else None

    await until(f"{wid} to end", probe, timeout_s)

    async def closed() -> bool:
        await crew.result(wid, timeout_s=30)
        return True

    await until(f"{wid}'s workflow to close", closed, timeout_s=60)
    for _ in range(10):
        row = await _observed(crew.store.get_work_item(wid))
        if row is not None:
            return row
        await asyncio.sleep(0.2)
    raise AssertionError(f"{wid}: its row could not be read")


async def _observed(read: Any) -> Any:
    """A read by the test itself; None when the database connection it ran on was ended under it."""
    try:
        return await read
    except Exception as exc:
        if store_unreachable(exc):
            return None
        raise


async def lease_grants(store: Store, key: str) -> list[LeaseHistory]:
    async with store.session() as s:
        q = select(LeaseHistory).where(LeaseHistory.key == key).order_by(LeaseHistory.acquired_at)
        return list((await s.scalars(q)).all())


async def leases_of(store: Store, wid: str, repo: Path | None = None) -> list[Lease]:
    async with store.session() as s:
        return list((await s.scalars(select(Lease).where(Lease.holder == wid))).all())


async def agent_tries(store: Store, wid: str) -> list[int]:
    """The Temporal attempts of run_agent whose first write was accepted, in order."""
    return [
        int(e.data["writer"].rsplit("#", 1)[1])
        for e in await store.list_events(wid)
        if e.type == "state_changed" and str(e.data.get("writer", "")).startswith("run_agent#")
    ]


async def assert_invariants(
    store: Store, ids: list[str], *, require_terminal: bool = True, temporal: Crew | None = None
) -> None:
    """Every invariant; with `temporal`, also against who Temporal's histories say completed each step."""
    histories = None
    if temporal is not None:
        histories = {}
        for wid in ids:
            row = await store.get_work_item(wid)
            assert row is not None
            history = await temporal.client.get_workflow_handle(row.workflow_id).fetch_history()
            histories[wid] = completed_steps(history)
    report = await check_invariants(store, ids, check_git=True, require_terminal=require_terminal, histories=histories)
    assert report.ok, str(report)


@pytest.fixture
def settings(tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str) -> Any:
    return make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend)


@contextlib.asynccontextmanager
async def submitter(settings: Any) -> AsyncIterator[Crew]:
    """The service and store without any worker: the pools run elsewhere (subprocesses)."""
    async with running_crew(settings, pools=()) as c:
        yield c


# ------------------------------------------------------------------------------------------------ zombie attempt


async def test_late_attempt_cannot_overwrite_newer_result(crew: Crew, tmp_path: Path) -> None:
    """Activity attempt 1 of run_agent goes silent (no heartbeats, no probes) past the heartbeat timeout after its first
    write; Temporal starts attempt 2, which writes and delivers. Attempt 1 then wakes, finishes and writes: the store
    rejects it, naming both ranks, and what is stored and landed is attempt 2's."""
    repo = calc(tmp_path / "zombie")
    wid = await crew.submit(
        code_change(
            repo, {"files": {"calc.py": RIGHT}, "stall_s": 20, "on_activity_attempt": 1}, review={"required": True}
        )
    )
    await crew.wait_state(wid, "awaiting_review", timeout_s=90)

    async def stale_events() -> list[Any]:
        return [e for e in await crew.store.list_events(wid) if e.type == "stale_write_rejected"]

    (stale,) = await until("the zombie's late write", stale_events, timeout_s=60)
    assert await agent_tries(crew.store, wid) == [1, 2]
    presented, current = Rank(**stale.data["presented"]), Rank(**stale.data["current"])
    assert presented.attempt == 1 and current > Rank(presented.step, 2) and stale.data["writer"] == "run_agent#1"

    row = await crew.store.get_work_item(wid)
    assert row is not None and row.state == "awaiting_review"
    await crew.service.review(row, ReviewDecision(action="approve"))
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason

    # The stored evidence is attempt 2's: its diff is the one recorded and landed; the zombie's diff artifact
    # exists but nothing references it.
    (finished,) = [e for e in await crew.store.list_events(wid) if e.type == "agent_finished"]
    assert finished.data["activity_attempt"] == 2 and Rank.decode(finished.rank or 0) == Rank(presented.step, 2)
    (attempt,) = await crew.store.list_attempts(wid)
    assert attempt.agent is not None and attempt.agent["diff_ref"]["id"] == finished.data["diff_ref"]
    diffs = [a.id for a in await crew.store.list_artifacts(wid) if a.name == "attempt-1.diff"]
    assert len(diffs) == 2 and finished.data["diff_ref"] in diffs
    assert git(repo, "show", f"crewwork/{wid}:calc.py") == RIGHT.strip()
    await assert_invariants(crew.store, [wid], temporal=crew)


# ------------------------------------------------------------------------------------------------ process death


@pytest.mark.parametrize("pool", ["agent", "control"])
async def test_sigkilled_pool_process_is_restarted_and_the_item_completes(
    settings: Any, tmp_path: Path, pool: str
) -> None:
    """SIGKILL of a real `crewwork worker` process while the agent runs: the agent pool's step is retried on the
    restarted process; the control pool (workflows and store activities) picks the workflow up again from history."""
    repo = calc(tmp_path / "killed")
    with pool_processes(settings) as stack:
        async with submitter(settings) as crew:
            wid = await crew.submit(code_change(repo, {"files": {"calc.py": RIGHT}, "delay_s": 6}))

            async def agent_running() -> bool:
                return bool(await agent_tries(crew.store, wid))

            await until("the agent to start", agent_running)
            victim = next(p for p in stack.processes if p.name == f"{pool}-0")
            assert victim.proc is not None
            killed_pid = victim.proc.pid
            stack.kill(f"{pool}-0", signal.SIGKILL)

            row = await terminal(crew, wid, timeout_s=150)
            assert row.state == "succeeded", row.reason
            assert victim.restarts_total >= 1 and victim.proc.pid != killed_pid
            # A killed agent process loses its step, which Temporal retries on the restarted one; a killed control
            # process loses nothing the agent was doing.
            assert await agent_tries(crew.store, wid) == ([1, 2] if pool == "agent" else [1])
            assert [a.number for a in await crew.store.list_attempts(wid)] == [1]
            assert await leases_of(crew.store, wid, repo) == []
            assert not (settings.resolved_worktree_dir() / wid).exists()
            assert "crewwork" not in git(repo, "worktree", "list")
            await assert_invariants(crew.store, [wid])


async def test_temporal_server_restart_mid_run_lets_in_flight_items_complete(
    tmp_path: Path, pg_url: str, sandbox_backend: str
) -> None:
    server = DevServer(tmp_path / "temporal", port=free_port(), ui=False)
    server.start()
    try:
        settings = make_settings(tmp_path, server, pg_url, sandbox_backend=sandbox_backend)
        repos = [calc(tmp_path / f"r{i}") for i in range(2)]
        async with running_crew(settings) as crew:
            wids = [await crew.submit(code_change(r, {"files": {"calc.py": RIGHT}, "delay_s": 3})) for r in repos]
            for wid in wids:
                await crew.wait_state(wid, "running", timeout_s=60)
            server.stop()
            await asyncio.sleep(1)
            server.start()
            rows = [await terminal(crew, wid, timeout_s=150) for wid in wids]
            assert [r.state for r in rows] == ["succeeded", "succeeded"], [r.reason for r in rows]
            for wid, repo in zip(wids, repos, strict=True):
                assert git(repo, "show", f"crewwork/{wid}:calc.py") == RIGHT.strip()
                assert await leases_of(crew.store, wid, repo) == []
            await assert_invariants(crew.store, wids)
    finally:
        server.stop()


async def test_terminated_database_connections_are_retried_and_nothing_is_written_twice(
    crew: Crew, tmp_path: Path, pg_url: str
) -> None:
    repos = [calc(tmp_path / f"pg{i}") for i in range(2)]
    wids = [await crew.submit(code_change(r, {"files": {"calc.py": RIGHT}, "delay_s": 2})) for r in repos]
    dbname = pg_url.rsplit("/", 1)[1]
    killed = 0
    stop = asyncio.Event()

    async def terminator() -> None:
        nonlocal killed
        admin = Store(pg_url.rsplit("/", 1)[0] + "/postgres", pool_size=1)
        try:
            while not stop.is_set():
                async with admin.session() as s:
                    res = await s.execute(
                        text(
                            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = :db AND pid <> pg_backend_pid()"
                        ),
                        {"db": dbname},
                    )
                    killed += int(res.scalar_one() or 0)
                await asyncio.sleep(0.7)
        finally:
            await admin.close()

    task = asyncio.create_task(terminator())
    try:
        rows = [await terminal(crew, wid, timeout_s=180) for wid in wids]
    finally:
        stop.set()
        await task
    assert killed > 0, "the fault was never injected"
    assert [r.state for r in rows] == ["succeeded", "succeeded"], [r.reason for r in rows]
    for wid, repo in zip(wids, repos, strict=True):
        assert [a.number for a in await crew.store.list_attempts(wid)] == [1]
        landed = [e for e in await crew.store.list_events(wid) if e.type == "landed"]
        assert len(landed) == 1 and landed[0].data["commit"] == git(repo, "rev-parse", f"crewwork/{wid}")
        assert await leases_of(crew.store, wid, repo) == []
    await assert_invariants(crew.store, wids)


# ------------------------------------------------------------------------------------------------ contention


async def test_two_items_on_the_same_branch_never_overlap_and_both_land(crew: Crew, calc_repo: Path) -> None:
    wids = [
        await crew.submit(code_change(calc_repo, {"files": {"calc.py": RIGHT + f"# item {i}\n"}, "delay_s": 2}))
        for i in range(2)
    ]
    rows = [await terminal(crew, wid) for wid in wids]
    assert [r.state for r in rows] == ["succeeded", "succeeded"], [r.reason for r in rows]
    grants = await lease_grants(crew.store, f"ws:{calc_repo}#main")
    assert sorted(g.holder for g in grants) == sorted(wids)
    first, second = grants
    assert first.ended_at is not None and first.ended_at <= second.acquired_at and second.ended_at is not None
    assert second.token > first.token
    # The event log on the database clock agrees: the second item acquired after the first released.
    events = {w: {e.type: e.created_at for e in await crew.store.list_events(w)} for w in wids}
    assert events[first.holder]["workspace_released"] <= events[second.holder]["workspace_acquired"]
    for i, wid in enumerate(wids):
        assert git(calc_repo, "show", f"crewwork/{wid}:calc.py").endswith(f"# item {i}")
    await assert_invariants(crew.store, wids)


async def test_concurrent_lease_acquisition_on_postgres_has_one_winner(pg_url: str) -> None:
    stores = [Store(pg_url, pool_size=2) for _ in range(8)]
    try:
        lease_key = "ws:concurrency-probe#main"
        won = await asyncio.gather(*(stores[i % 8].acquire_lease(lease_key, f"holder-{i}", 30) for i in range(40)))
        winners = [i for i, (t, _) in enumerate(won) if t is not None]
        assert len(winners) == 1, "exactly one of 40 concurrent acquirers holds the lease"
        assert {h for t, h in won if t is None} == {f"holder-{winners[0]}"}, "the others are told who holds it"
        grants = await lease_grants(stores[0], lease_key)
        assert len(grants) == 1 and grants[0].token == won[winners[0]][0]
    finally:
        for s in stores:
            await s.close()


# ------------------------------------------------------------------------------------------------ endings


async def test_cancellation_releases_leases_and_removes_worktrees(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(code_change(calc_repo, {"files": {"calc.py": RIGHT}, "delay_s": 60}))

    async def agent_running() -> bool:
        return bool(await agent_tries(crew.store, wid))

    await until("the agent to start", agent_running)
    row = await crew.store.get_work_item(wid)
    assert row is not None
    await crew.service.cancel(row)
    with pytest.raises(WorkflowFailureError) as failure:
        await crew.result(wid)
    assert is_cancelled_exception(failure.value.cause), "the workflow ends cancelled, not failed"
    row = await crew.store.get_work_item(wid)
    assert row is not None and row.state == "cancelled"

    async def all_released() -> bool:
        gone = not (crew.settings.resolved_worktree_dir() / wid).exists()
        return gone and await leases_of(crew.store, wid, calc_repo) == []

    await until("leases and worktrees to be released", all_released, timeout_s=30)
    assert "crewwork" not in git(calc_repo, "worktree", "list")
    assert git(calc_repo, "branch", "--list", f"crewwork/{wid}") == ""
    await assert_invariants(crew.store, [wid])


async def test_infrastructure_errors_exhausting_retries_end_dead_with_last_error(crew: Crew) -> None:
    wid = await crew.submit(
        {
            "kind": "task",
            "input": {},
            "agent": {"name": "scripted", "config": {"fail": "disk on fire", "on_activity_attempt": "all"}},
        }
    )
    result = await crew.result(wid)
    assert result.state == "dead"
    assert "after 3 tries" in result.reason and "scripted fault: disk on fire" in result.reason
    assert await agent_tries(crew.store, wid) == [1, 2, 3]
    row = await crew.store.get_work_item(wid)
    assert row is not None and row.state == "dead" and "disk on fire" in row.reason
    await assert_invariants(crew.store, [wid])


async def test_bad_input_fails_fast_without_retries(crew: Crew) -> None:
    from temporalio.api.enums.v1 import EventType

    from crewwork.models import WorkItemInput, WorkItemSpec
    from crewwork.workflows.work_item import WorkItemWorkflow

    # Past the API's checks (as if the submission were from an older version): an agent config no agent accepts.
    spec = WorkItemSpec.model_validate(
        {"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {"no_such_key": 1}}}
    )
    row, _ = await crew.store.create_work_item(tenant_id=crew.tenant_id, spec=spec, base_commit=None, repo_path=None)
    handle = await crew.client.start_workflow(
        WorkItemWorkflow.run,
        WorkItemInput(work_item_id=row.id, tenant_id=row.tenant_id, spec=spec),
        id=row.workflow_id,
        task_queue=crew.settings.task_queue("control"),
        result_type=WorkItemResult,
    )
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.state == "dead" and result.reason.startswith("bad input:") and "no_such_key" in result.reason
    history = await handle.fetch_history()
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "run_agent"
    }
    started = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]
    assert started == [1], "a non-retryable error is not retried"
    await assert_invariants(crew.store, [row.id])


async def test_review_outlasting_the_workspace_lease_still_lands(crew: Crew, calc_repo: Path) -> None:
    """A reviewer who takes longer than the workspace lease's lifetime must not turn an approved change into a dead
    work item; the delivery branch is this item's own, guarded by compare-and-swap, and the lease is still freed."""
    wid = await crew.submit(code_change(calc_repo, {"files": {"calc.py": RIGHT}}, review={"required": True}))
    row = await crew.wait_state(wid, "awaiting_review", timeout_s=60)
    key = f"ws:{calc_repo}#main"
    async with crew.store.session() as s:
        # The database clock moves past the lease's expiry while the item waits for its review.
        await s.execute(text("UPDATE leases SET expires_at = expires_at - 3600 WHERE key = :k"), {"k": key})
    await crew.service.review(row, ReviewDecision(action="approve"))
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason
    assert git(calc_repo, "show", f"crewwork/{wid}:calc.py") == RIGHT.strip()
    assert await leases_of(crew.store, wid, calc_repo) == []
    await assert_invariants(crew.store, [wid])


async def test_workspace_lease_is_kept_alive_while_the_agent_works(crew: Crew, calc_repo: Path) -> None:
    """A long attempt's liveness rounds also renew the item's workspace lease: a lease that would expire during a long
    agent run is extended, so a second item on the branch keeps waiting instead of starting alongside."""
    first = await crew.submit(code_change(calc_repo, {"files": {"calc.py": RIGHT}, "delay_s": 5}))
    key = f"ws:{calc_repo}#main"

    async def agent_running() -> bool:
        return bool(await agent_tries(crew.store, first))

    await until("the agent to start", agent_running)
    async with crew.store.session() as s:
        # As if the agent had already run for most of the workspace lease's lifetime.
        await s.execute(
            text("UPDATE leases SET expires_at = extract(epoch from clock_timestamp()) + 5 WHERE key = :k"), {"k": key}
        )
    second = await crew.submit(code_change(calc_repo, {"files": {"calc.py": RIGHT + "# second\n"}}))

    async def extended() -> bool:
        lease = await crew.store.get_lease(key)
        return lease is not None and lease.holder == first and lease.expires_at > await crew.store.db_now() + 60

    await until("the workspace lease to be renewed", extended, timeout_s=20)
    rows = [await terminal(crew, wid) for wid in (first, second)]
    assert [r.state for r in rows] == ["succeeded", "succeeded"], [r.reason for r in rows]
    ev = {w: {e.type: e.created_at for e in await crew.store.list_events(w)} for w in (first, second)}
    assert ev[first]["workspace_released"] <= ev[second]["workspace_acquired"], "the second item waited"
    grants = await lease_grants(crew.store, key)
    assert [(g.holder, g.end_reason) for g in grants] == [(first, "released"), (second, "released")]
    await assert_invariants(crew.store, [first, second])
