"""Scale-out: the control, agent and validate pools each run as two separate processes against one Temporal server
and one PostgreSQL (the shape of a multi-machine deployment; nothing is shared but those two). A batch of work
items spreads over all of them, one process of each pool is killed with SIGKILL mid-run, and every item still
completes exactly once. Where work ran is read from Temporal's own histories (worker identity PID@host)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import BUGGY, RIGHT, TEST
from tests.conftest import Crew, make_repo, make_settings, running_crew
from tests.deploy.procs import PoolProcesses, activity_identities, pending_activity_workers
from tests.integration.test_lifecycle import VALIDATION

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

ITEMS = 12
PROCESSES_PER_POOL = 2
AGENT_STEP_S = 2.0  # long enough that agent activities are in flight when the kill comes


def item(repo: Path) -> dict[str, Any]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": RIGHT}, "delay_s": AGENT_STEP_S}]}},
        "budget": {"max_attempts": 2},
    }


async def running_on(crew: Crew, workflow_ids: list[str], activity: str) -> set[str]:
    found: set[str] = set()
    for wf in workflow_ids:
        ident = (await pending_activity_workers(crew.client, wf)).get(activity)
        if ident:
            found.add(ident)
    return found


async def busy_process(
    crew: Crew, procs: PoolProcesses, pool: str, workflows: list[str], activity: str, seen: set[str]
) -> Any:
    """Once every process of `pool` has been seen running `activity` (added to `seen`), one that is running it right
    now, so that killing it interrupts real work. A killed attempt leaves no trace in history (only the retry that
    completes does), so this live view is the evidence that the killed process had its share of the work."""
    members = {procs.identity(p): p for p in procs.of(pool)}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        busy = await running_on(crew, workflows, activity) & set(members)
        seen |= busy
        if seen == set(members) and busy:
            return members[sorted(busy)[0]]
        await asyncio.sleep(0.05)
    raise AssertionError(f"{pool}: processes seen running {activity}: {seen} of {set(members)}")


async def control_with_history(crew: Crew, procs: PoolProcesses, workflows: list[str]) -> Any:
    """Once both control processes have handled workflow tasks (their identities are in the histories), the first
    of them: killing one that never had work would leave nothing to assert about its share."""
    members = {procs.identity(p): p for p in procs.of("control")}
    seen: set[str] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for wf in workflows:
            seen |= {ident for _a, ident in (await activity_identities(crew.client, wf))["workflow_task"]}
        if set(members) <= seen:
            return members[sorted(members)[0]]
        await asyncio.sleep(0.5)
    raise AssertionError(f"control: processes seen handling workflow tasks: {seen & set(members)} of {set(members)}")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


async def test_pools_as_separate_processes_share_the_work_and_survive_losing_one_process_each(
    tmp_path: Path, temporal_server: Any, pg_url: str, sandbox_backend: str
) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend, lease_ttl_s=15.0)
    procs = PoolProcesses(settings, tmp_path / "logs")
    repos = [make_repo(tmp_path / f"repo{i}", {"calc.py": BUGGY, "tests/test_calc.py": TEST}) for i in range(ITEMS)]
    bases = {str(r): git(r, "rev-parse", "main") for r in repos}
    try:
        for pool in ("control", "agent", "validate"):
            procs.start(pool, PROCESSES_PER_POOL)
        async with running_crew(settings, pools=()) as crew:
            ids = [await crew.submit(item(r)) for r in repos]
            rows = [await crew.store.get_work_item(w) for w in ids]
            workflows = [r.workflow_id for r in rows if r is not None]

            # Kill one process of each pool while it has work in flight: agent first (agent steps come first),
            # then validate, then control.
            killed: dict[str, str] = {}
            seen: dict[str, set[str]] = defaultdict(set)
            for pool, activity in (("agent", "run_agent"), ("validate", "validate_change")):
                victim = await busy_process(crew, procs, pool, workflows, activity, seen[pool])
                procs.kill(victim, signal.SIGKILL)
                killed[pool] = procs.identity(victim)
            victim = await control_with_history(crew, procs, workflows)
            procs.kill(victim, signal.SIGKILL)
            killed["control"] = procs.identity(victim)

            results = await asyncio.gather(*(crew.result(w, timeout_s=300) for w in ids))
            assert [r.state for r in results] == ["succeeded"] * ITEMS, [(r.state, r.reason) for r in results]

            # Exactly one landing per item, on its own delivery branch, whose parent is the untouched base.
            for wid, repo, res in zip(ids, repos, results, strict=True):
                landed = [e for e in await crew.store.list_events(wid) if e.type == "landed"]
                assert len(landed) == 1, f"{wid}: {len(landed)} landings"
                assert git(repo, "show", f"crewwork/{wid}:calc.py") == RIGHT.strip()
                assert git(repo, "rev-parse", f"crewwork/{wid}^") == bases[str(repo)]
                assert git(repo, "rev-parse", "main") == bases[str(repo)]
                assert res.landed_commit == git(repo, "rev-parse", f"crewwork/{wid}")

            try:
                from tests.invariants import check_invariants
            except ImportError:  # pragma: no cover - the checker lands with the reliability work
                check_invariants = None  # type: ignore[assignment]
            if check_invariants is not None:
                (await check_invariants(crew.store, ids, check_git=True)).assert_ok()

            # Where the work ran, per Temporal's histories.
            ran: dict[str, list[tuple[int, str]]] = defaultdict(list)
            for wf in workflows:
                for kind, starts in (await activity_identities(crew.client, wf)).items():
                    ran[kind].extend(starts)
            by_pool = {
                "agent": {ident for _, ident in ran["run_agent"]} | seen["agent"],
                "validate": {ident for _, ident in ran["validate_change"]} | seen["validate"],
                "control": {ident for _, ident in ran["workflow_task"]} | {ident for _, ident in ran["admit"]},
            }
            for pool, idents in by_pool.items():
                expected = {procs.identity(p) for p in procs.of(pool)}
                assert idents <= expected, f"{pool} work ran outside its pool: {idents - expected}"
                assert idents == expected, f"{pool}: work did not spread over both processes: {idents}"
            # An activity interrupted by the kill was retried on the surviving process.
            survivors = {pool: {procs.identity(p) for p in procs.of(pool)} - {killed[pool]} for pool in killed}
            assert any(a >= 2 and i in survivors["agent"] for a, i in ran["run_agent"]), ran["run_agent"]
            assert any(a >= 2 and i in survivors["validate"] for a, i in ran["validate_change"]), ran["validate_change"]
            print(
                "\nscale-out: "
                + ", ".join(f"{pool} {sorted(ids)}" for pool, ids in by_pool.items())
                + f"; killed mid-activity {killed}"
            )
    finally:
        procs.stop_all()
