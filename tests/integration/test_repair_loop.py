"""The repair loop: evidence-based completion, budgets, the same-cause breaker, review and long loops.

Real Temporal dev server, real PostgreSQL, real bubblewrap sandbox and real pytest runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select

from crewwork.api.service import SubmissionRejected
from crewwork.cli.demo import RIGHT, WRONG
from crewwork.models import ReviewDecision
from crewwork.store.tables import Artifact
from tests.conftest import Crew, make_repo, running_crew
from tests.integration.test_lifecycle import VALIDATION, code_change, git

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def _artifact_text(crew: Crew, artifact_id: str) -> str:
    async with crew.store.session() as s:
        data = await s.scalar(select(Artifact.content).where(Artifact.id == artifact_id))
    assert data is not None
    return bytes(data).decode()


async def test_no_tests_collected_is_a_failure(crew: Crew, calc_repo: Path) -> None:
    validation = {**VALIDATION, "command": [*VALIDATION["command"], "-k", "no_test_has_this_name"]}
    wid = await crew.submit(
        code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], validation=validation, budget={"max_attempts": 1})
    )
    result = await crew.result(wid)
    assert result.state == "failed"
    assert result.attempts[0].validation is not None
    assert result.attempts[0].validation.cause == "no_tests", result.attempts[0].validation.reason


async def test_diagnostics_of_a_failed_attempt_reach_the_next_attempt(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]))
    result = await crew.result(wid)
    assert result.state == "succeeded"
    second = result.attempts[1].agent
    assert second is not None and second.transcript_ref is not None
    transcript = await _artifact_text(crew, second.transcript_ref.id)
    assert "test_adds_negative_numbers" in transcript, transcript
    assert "assert 2 == 0" in transcript


async def test_breaker_stops_after_k_same_cause_failures_across_a_worker_restart(
    tmp_path: Path, temporal_server: object, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend)  # type: ignore[arg-type]
    async with running_crew(settings) as crew:
        wid = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": WRONG}}], budget={"max_attempts": 10}))
        for _ in range(600):
            if len(await crew.store.list_attempts(wid)) >= 2:
                break
            await asyncio.sleep(0.1)
    # Every worker is gone now, mid-loop. New workers pick the same workflow up from its history.
    async with running_crew(settings) as crew2:
        result = await crew2.result(wid)
    assert result.state == "failed"
    assert result.reason.startswith("breaker:"), result.reason
    from crewwork.store.store import Store

    store = Store(pg_url)
    try:
        attempts = await store.list_attempts(wid)
    finally:
        await store.close()
    assert len(attempts) == 3, "K=3 consecutive same-cause failures, then stop"
    assert len({a.fingerprint for a in attempts}) == 1


async def test_wall_clock_budget_ends_the_item(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(
        code_change(
            calc_repo,
            [{"files": {"calc.py": WRONG}, "delay_s": 1.5}],
            budget={"max_attempts": 10, "max_wall_clock_s": 1.0},
        )
    )
    result = await crew.result(wid)
    assert result.state == "failed" and result.reason.startswith("wall_clock:"), result.reason
    assert len(result.attempts) == 1


async def test_token_budget_ends_the_item(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(
        code_change(
            calc_repo,
            [
                {"files": {"calc.py": WRONG}, "tokens": 600},
                {"files": {"calc.py": "def add(a, b):\n    return 1\n"}, "tokens": 600},
            ],
            budget={"max_attempts": 10, "max_tokens": 1000},
        )
    )
    result = await crew.result(wid)
    assert result.state == "failed" and result.reason.startswith("tokens:"), result.reason
    assert len(result.attempts) == 2


async def test_cost_budget_ends_the_item(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(
        code_change(
            calc_repo,
            [
                {"files": {"calc.py": WRONG}, "cost_usd": 0.30},
                {"files": {"calc.py": "def add(a, b):\n    return 1\n"}, "cost_usd": 0.30},
            ],
            budget={"max_attempts": 10, "max_cost_usd": 0.5},
        )
    )
    result = await crew.result(wid)
    assert result.state == "failed" and result.reason.startswith("cost:"), result.reason
    assert len(result.attempts) == 2


async def test_budget_above_operator_ceiling_is_refused_at_submission(crew: Crew, calc_repo: Path) -> None:
    crew.settings.max_attempts_ceiling = 5
    with pytest.raises(SubmissionRejected, match="allows at most 5") as rejected:
        await crew.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], budget={"max_attempts": 50}))
    assert rejected.value.field == "budget.max_attempts"


async def test_review_comment_reaches_the_agent(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(
        code_change(
            calc_repo,
            [{"files": {"calc.py": RIGHT}}, {"files": {"calc.py": RIGHT + "# tidy\n"}}],
            review={"required": True},
        )
    )
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="request_changes", comment="please keep it tidy"))
    await crew.wait_attempts(wid, 2)
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="approve"))
    result = await crew.result(wid)
    assert result.state == "succeeded"
    second = result.attempts[-1].agent
    assert second is not None and second.transcript_ref is not None
    assert "please keep it tidy" in await _artifact_text(crew, second.transcript_ref.id)


async def test_review_timeout_ends_the_item(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(
        code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True, "timeout_s": 1})
    )
    result = await crew.result(wid)
    assert result.state == "failed" and result.reason == "review timed out"
    assert git(calc_repo, "branch", "--list", f"crewwork/{wid}") == ""


async def test_sixty_attempt_loop_continues_as_new_and_keeps_history_small(crew: Crew, tmp_path: Path) -> None:
    # A cheap checker instead of pytest keeps 60 validations fast. Each failing attempt fails a different test
    # (named after what the agent wrote), so the same-cause breaker does not stop the loop.
    checker = (
        "import pathlib\n"
        "v = pathlib.Path('answer.txt').read_text().strip()\n"
        "ok = v == 'right'\n"
        "case = '<testcase classname=\"check\" name=\"test_%s\">%s</testcase>' % (v, '' if ok else '<failure message=\"wrong\"/>')\n"
        "pathlib.Path('.crewwork').mkdir(exist_ok=True)\n"
        "pathlib.Path('.crewwork/junit.xml').write_text('<testsuite tests=\"1\" failures=\"%d\">%s</testsuite>' % (0 if ok else 1, case))\n"
        "raise SystemExit(0 if ok else 1)\n"
    )
    repo = make_repo(tmp_path / "loop-repo", {"answer.txt": "none\n", "check.py": checker})
    validation = {"command": ["python", "check.py"], "junit_path": ".crewwork/junit.xml", "timeout_s": 60}
    steps: list[dict[str, object]] = [{"files": {"answer.txt": f"wrong{k}\n"}} for k in range(1, 60)]
    steps.append({"files": {"answer.txt": "right\n"}})
    wid = await crew.submit(code_change(repo, steps, validation=validation, budget={"max_attempts": 60}))
    result = await crew.result(wid, timeout_s=900)
    assert result.state == "succeeded", result.reason
    attempts = await crew.store.list_attempts(wid)
    assert [a.number for a in attempts] == list(range(1, 61))
    assert attempts[-1].verdict == "passed" and all(a.verdict == "failed" for a in attempts[:-1])

    row = await crew.store.get_work_item(wid)
    assert row is not None
    runs = []
    async for wf in crew.client.list_workflows(f"WorkflowId = '{row.workflow_id}'"):
        runs.append(wf.run_id)
    assert len(runs) >= 3, "60 attempts at 20 per run continue-as-new at least twice"
    for run_id in runs:
        history = await crew.client.get_workflow_handle(row.workflow_id, run_id=run_id).fetch_history()
        assert len(history.events) < 1000, f"run {run_id} has {len(history.events)} events"


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ({"validation": {**VALIDATION, "command": ["pytset", "-q"]}}, "validation.command[0] `pytset`"),
        ({"environment": {"setup": [["pip-instal", "-e", "."]]}}, "`pip-instal`"),
        ({"validation": {**VALIDATION, "setup": [["make-it-so"]]}}, "`make-it-so`"),
    ],
)
async def test_a_command_that_does_not_exist_ends_the_item_after_its_first_attempt_naming_it(
    crew: Crew, calc_repo: Path, where: dict[str, object], field: str
) -> None:
    """The submission's problem, not the agent's: before, every attempt ran the (paid) agent again until the budget
    or the breaker stopped it, and the final reason never named the command."""
    steps = [{"files": {"calc.py": RIGHT}, "tokens": 1000}]
    wid = await crew.submit(code_change(calc_repo, steps, budget={"max_attempts": 3}, **where))
    result = await crew.result(wid)
    assert result.state == "failed"
    assert len(result.attempts) == 1, [a.reason for a in result.attempts]
    assert field in result.reason and "stopped after attempt 1" in result.reason, result.reason
    row = await crew.store.get_work_item(wid)
    assert row is not None and row.attempt_count == 1 and field in row.reason


# What a module the tests import can do once the agent changed it: write, to the test process's real stderr (past
# pytest's capture), the very line bubblewrap writes when it cannot exec a program, and exit 1 as bwrap does.
FORGED_NOT_FOUND = (
    "import os\n"
    "for fd in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        if os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:'):\n"
    "            os.write(int(fd), b'bwrap: execvp python: No such file or directory\\n')\n"
    "    except OSError:\n"
    "        pass\n"
    "os._exit(1)\n"
)


async def test_code_under_test_cannot_pass_for_a_missing_command_and_end_the_item(crew: Crew, calc_repo: Path) -> None:
    """Only bwrap's own failure to start the program is `command_not_found` (which ends the item as the submission's
    fault): code under test that writes bwrap's words and exits 1 is a failed attempt like any other, and the repair
    loop goes on. Before, attempt 1's change ended the item: `validation.command[0] `python` does not exist … stopped
    after attempt 1`, with exit code 127 recorded as measured evidence for a program that ran."""
    steps = [{"files": {"calc.py": FORGED_NOT_FOUND}}, {"files": {"calc.py": RIGHT}}]
    wid = await crew.submit(code_change(calc_repo, steps, budget={"max_attempts": 3}))
    result = await crew.result(wid)
    attempts = await crew.store.list_attempts(wid)
    assert [a.cause for a in attempts][:1] != ["command_not_found"], [a.reason for a in attempts]
    assert result.state == "succeeded", result.reason
    first = result.attempts[0].validation
    assert first is not None and first.sandbox is not None
    assert not first.sandbox.command_not_found and first.sandbox.exit_code == 1
