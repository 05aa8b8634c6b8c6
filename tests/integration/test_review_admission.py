"""An item that reviewers send back takes a place under its tenant's in-flight limit again, on a real Temporal dev
server, real PostgreSQL, real git and a real sandbox.

Awaiting review holds no place (it goes to the next queued item). Before, a request for changes sent the item
straight back to its agent: a tenant with a limit of 1 could let any number of items reach review, then ask for
changes on all of them at once and run that many agents side by side in the shared pools."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import BUGGY, RIGHT, TEST
from crewwork.models import ReviewDecision
from crewwork.store.fencing import IN_FLIGHT_STATES
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_repo, make_settings, running_crew
from tests.integration.test_lifecycle import code_change
from tests.invariants import check_invariants

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def _most_in_flight(events: list[Any]) -> int:
    """The most items of `events` (state changes of several items, in commit order) in an in-flight state at once."""
    state: dict[str, str] = {}
    most = 0
    for e in events:
        state[e.work_item_id] = str(e.data["state"])
        most = max(most, sum(1 for s in state.values() if s in IN_FLIGHT_STATES))
    return most


async def test_changes_requested_on_every_item_at_once_keeps_the_tenant_limit(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str
) -> None:
    settings = make_settings(
        tmp_path / "crew", temporal_server, pg_url, sandbox_backend=sandbox_backend, tenant_max_in_flight=1
    )
    n = 3
    repos = [
        make_repo(tmp_path / f"repo{i}", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
        for i in range(n)
    ]
    async with running_crew(settings) as crew:
        # The second attempt's agent takes a while: side-by-side runs would overlap for seconds.
        steps = [{"files": {"calc.py": RIGHT}}, {"files": {"calc.py": RIGHT + "# reviewed\n"}, "delay_s": 1.5}]
        ids = [await crew.submit(code_change(r, steps, review={"required": True})) for r in repos]
        rows = [await crew.wait_state(wid, "awaiting_review", timeout_s=120) for wid in ids]

        # Every item asks for changes at once: one place, so one runs and the others wait in `queued`.
        await asyncio.gather(
            *(crew.service.review(row, ReviewDecision(action="request_changes", comment="add a line")) for row in rows)
        )
        for wid in ids:
            await crew.wait_attempts(wid, 2, timeout_s=120)
        rows = [await crew.wait_state(wid, "awaiting_review", timeout_s=120) for wid in ids]
        # Approved one after the other: landing after approval is not admitted again (docs/operations.md).
        for wid, row in zip(ids, rows, strict=True):
            await crew.service.review(row, ReviewDecision(action="approve"))
            assert (await crew.result(wid)).state == "succeeded"

        logs = {wid: await crew.store.list_events(wid) for wid in ids}
        events = sorted((e for evs in logs.values() for e in evs if e.type == "state_changed"), key=lambda e: e.id)
        assert _most_in_flight(events) == 1, [(e.work_item_id[-6:], e.data["state"]) for e in events]
        waited = [e for e in events if e.data["state"] == "queued" and "changes requested" in str(e.data.get("reason"))]
        assert len(waited) == n, "each item sent back waits for a place first"
        # Each went on by an admission or by a place handed to it, never straight from review to its agent.
        for wid in ids:
            mine = [str(e.data["state"]) for e in events if e.work_item_id == wid]
            back = mine.index("awaiting_review")
            assert mine[back + 1 : back + 4] == ["queued", "admitted", "running"], mine
        # The agents of the second attempts never ran side by side.
        spans = []
        for evs in logs.values():
            start = [
                e.created_at
                for e in evs
                if e.type == "state_changed" and e.data["state"] == "running" and e.data.get("attempt") == 2
            ]
            end = [e.created_at for e in evs if e.type == "agent_finished" and e.data.get("attempt") == 2]
            assert start and end, [e.type for e in evs]
            spans.append((min(start), max(end)))
        spans.sort()
        for (_s0, e0), (s1, _e1) in itertools.pairwise(spans):
            assert s1 >= e0, f"second attempts overlapped: {spans}"
        (await check_invariants(crew.store, ids, check_git=True)).assert_ok()


async def test_a_sent_back_item_gives_up_its_workspace_while_it_waits_for_a_place(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    """Two items of one branch, limit 1. The first goes to review (its place goes to the second, which then waits
    for the branch's workspace lease) and is sent back. Waiting for a place while holding the lease deadlocked the
    two until the lease expired (10 min, an hour after review renewed it), and then let both work on the branch."""
    settings = make_settings(
        tmp_path / "crew", temporal_server, pg_url, sandbox_backend=sandbox_backend, tenant_max_in_flight=1
    )
    async with running_crew(settings) as crew:
        first_steps = [{"files": {"calc.py": RIGHT}}, {"files": {"calc.py": RIGHT + "# reviewed\n"}}]
        first = await crew.submit(code_change(calc_repo, first_steps, review={"required": True}))
        row = await crew.wait_state(first, "awaiting_review", timeout_s=120)
        second = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True}))
        await crew.wait_state(second, "admitted")  # holds the place, waits for the workspace
        await crew.service.review(row, ReviewDecision(action="request_changes", comment="add a line"))
        # The second gets the workspace and reaches review; its place goes back to the first, which waits for the
        # workspace in turn until the second lands.
        row2 = await crew.wait_state(second, "awaiting_review", timeout_s=120)
        await crew.service.review(row2, ReviewDecision(action="approve"))
        assert (await crew.result(second)).state == "succeeded"
        row = await crew.wait_state(first, "awaiting_review", timeout_s=120)
        await crew.service.review(row, ReviewDecision(action="approve"))
        assert (await crew.result(first)).state == "succeeded"
        events = [e for wid in (first, second) for e in await crew.store.list_events(wid)]
        assert not [e for e in events if e.type == "workspace_lease_expired"], "a lease ran out: the items deadlocked"
        grants = sorted((e.id, e.work_item_id[-6:], e.type) for e in events if e.type.startswith("workspace_"))
        # first: acquired, released (sent back), acquired again after its admission, released at the end.
        assert [t for _i, w, t in grants if w == first[-6:]] == [
            "workspace_acquired",
            "workspace_released",
            "workspace_acquired",
            "workspace_released",
        ], grants
        (await check_invariants(crew.store, [first, second], check_git=True)).assert_ok()
