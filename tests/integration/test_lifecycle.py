"""Work items end to end on a real Temporal dev server, real PostgreSQL, real git and a real bubblewrap sandbox."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.models import ReviewDecision
from tests.conftest import ApiServer, Crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

VALIDATION = {
    "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
    "test_files": ["tests/test_calc.py"],
}


def code_change(repo: Path, steps: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": steps}},
        "budget": {"max_attempts": 3},
    }
    item.update(kw)
    return item


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


async def test_failing_then_passing_repair_lands_on_delivery_branch(crew: Crew, calc_repo: Path) -> None:
    main_before = git(calc_repo, "rev-parse", "main")
    wid = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]))
    result = await crew.result(wid)

    assert result.state == "succeeded", result.reason
    assert [a.verdict for a in result.attempts] == ["failed", "passed"]
    first = result.attempts[0].validation
    assert first is not None and first.cause == "test_failure" and first.exit_code == 1
    assert any(t.outcome == "failed" and "test_adds_negative_numbers" in t.id for t in first.tests)
    assert result.mock, "a scripted agent's result must be labelled mock"

    branch = f"crewwork/{wid}"
    assert result.delivery_branch == branch
    assert git(calc_repo, "show", f"{branch}:calc.py") == RIGHT.strip()
    assert git(calc_repo, "rev-parse", f"{branch}^") == main_before
    assert git(calc_repo, "rev-parse", "main") == main_before, "the target branch must never move"

    row = await crew.store.get_work_item(wid)
    assert row is not None and row.state == "succeeded" and row.landed_commit == result.landed_commit
    attempts = await crew.store.list_attempts(wid)
    assert [a.verdict for a in attempts] == ["failed", "passed"]
    types = [e.type for e in await crew.store.list_events(wid)]
    assert types[0] == "submitted" and "landed" in types and types.count("attempt_recorded") == 2
    # Worktrees of the item are gone once it ends.
    assert not (crew.settings.resolved_worktree_dir() / wid).exists()
    assert "crewwork" not in git(calc_repo, "worktree", "list")
    assert await crew.store.get_lease(f"ws:{calc_repo}#main") is None


async def test_the_repositorys_tests_never_run_with_crewworks_packages(crew: Crew, calc_repo: Path) -> None:
    """Validation runs the sandbox's own Python (or the repository's environment), never the worker's virtualenv:
    no pytest plugin of crewwork's (pytest-asyncio, pytest-timeout, hypothesis, ...) loads into the repository's
    tests, and nothing crewwork imports can be imported there."""
    probe = "import importlib.util as u; print('WORKER-PACKAGES', [m for m in ('crewwork', 'temporalio', 'pytest_asyncio') if u.find_spec(m)])"
    validation = {
        **VALIDATION,
        "command": [
            "sh",
            "-c",
            f'python -m pytest --version --version; python -c "{probe}"; exec "$@"',
            "validate",
            *VALIDATION["command"],
        ],
    }
    wid = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], validation=validation))
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason
    [attempt] = await crew.store.list_attempts(wid)
    log = (await crew.store.artifact_content(attempt.validation["log_ref"]["id"]) or b"").decode()  # type: ignore[index]
    assert "This is pytest version" in log, log[-2000:]
    assert "registered third-party plugins" not in log, log[-2000:]
    assert "WORKER-PACKAGES []" in log, log[-2000:]
    assert "asyncio_default_fixture_loop_scope" not in log and "PytestDeprecationWarning" not in log


async def test_work_item_that_exhausts_max_attempts_ends_failed(crew: Crew, calc_repo: Path) -> None:
    wrong1 = "def add(a, b):\n    return 0\n"
    wid = await crew.submit(
        code_change(
            calc_repo,
            [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": wrong1}}],
            budget={"max_attempts": 2},
        )
    )
    result = await crew.result(wid)
    assert result.state == "failed"
    assert result.reason.startswith("attempts:"), result.reason
    assert [a.verdict for a in result.attempts] == ["failed", "failed"]
    assert result.delivery_branch is None
    assert git(calc_repo, "branch", "--list", f"crewwork/{wid}") == ""


async def test_empty_diff_is_not_success(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(code_change(calc_repo, [{"claims": "I fixed it, trust me"}], budget={"max_attempts": 1}))
    result = await crew.result(wid)
    assert result.state == "failed"
    assert result.attempts[0].validation is not None and result.attempts[0].validation.cause == "empty_diff"


async def test_weakened_test_is_reset_before_validation(crew: Crew, calc_repo: Path) -> None:
    weakened = (
        "def test_adds_positive_numbers():\n    assert True\n\ndef test_adds_negative_numbers():\n    assert True\n"
    )
    wid = await crew.submit(
        code_change(calc_repo, [{"files": {"tests/test_calc.py": weakened}}], budget={"max_attempts": 1})
    )
    result = await crew.result(wid)
    assert result.state == "failed", "a change that only weakens the tests must not pass"


async def test_review_request_changes_reaches_next_attempt_then_approve(crew: Crew, calc_repo: Path) -> None:
    wid = await crew.submit(
        code_change(
            calc_repo,
            [{"files": {"calc.py": RIGHT}}, {"files": {"calc.py": RIGHT + "# reviewed\n"}}],
            review={"required": True},
        )
    )
    row = await crew.wait_state(wid, "awaiting_review")
    with pytest.raises(Exception, match="request_changes needs a comment"):
        await crew.service.review(row, ReviewDecision(action="request_changes", comment=" "))
    await crew.service.review(row, ReviewDecision(action="request_changes", comment="please add a comment line"))
    await crew.wait_attempts(wid, 2)
    row = await crew.wait_state(wid, "awaiting_review")
    attempts = await crew.store.list_attempts(wid)
    assert len(attempts) == 2
    transcript_events = [e for e in await crew.store.list_events(wid) if e.type == "state_changed"]
    assert any("attempt 2" in e.data.get("reason", "") for e in transcript_events)
    await crew.service.review(row, ReviewDecision(action="approve"))
    result = await crew.result(wid)
    assert result.state == "succeeded"
    assert "# reviewed" in git(calc_repo, "show", f"crewwork/{wid}:calc.py")


async def test_review_sent_at_the_wrong_time_is_rejected(crew: Crew, calc_repo: Path) -> None:
    from crewwork.api.service import ReviewRejected

    wid = await crew.submit(
        code_change(calc_repo, [{"files": {"calc.py": RIGHT}, "delay_s": 3}], review={"required": True})
    )
    row = await crew.wait_state(wid, "running")
    with pytest.raises(ReviewRejected, match="not awaiting review"):
        await crew.service.review(row, ReviewDecision(action="approve"))
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="reject", comment="not this way"))
    result = await crew.result(wid)
    assert result.state == "rejected"


async def test_task_round_trips_its_output_through_the_api(crew: Crew) -> None:
    _kid, key = await crew.store.create_api_key("api-tenant")
    async with ApiServer(crew.settings) as api, api.client(key) as c:
        r = await c.post(
            "/v1/work-items",
            json={
                "kind": "task",
                "input": {"question": "6*7"},
                "agent": {"name": "scripted", "config": {"output": {"answer": 42}, "delay_s": 0.2}},
            },
        )
        assert r.status_code == 202, r.text
        wid = r.json()["id"]
        result = await crew.result(wid)
        assert result.state == "succeeded" and result.output == {"answer": 42} and result.mock
        item = (await c.get(f"/v1/work-items/{wid}")).json()
        assert item["state"] == "succeeded" and item["result"]["output"] == {"answer": 42} and item["mock"]
        listed = (await c.get("/v1/work-items")).json()
        assert [i["id"] for i in listed["items"]] == [wid]
        events = (await c.get(f"/v1/work-items/{wid}/events")).json()
        assert events[0]["type"] == "submitted" and events[-1]["data"]["state"] == "succeeded"


async def test_bad_submissions_are_rejected_before_any_workflow_starts(
    crew: Crew, calc_repo: Path, tmp_path: Path
) -> None:
    _kid, key = await crew.store.create_api_key("bad-input")
    other_root = tmp_path / "roots"
    other_root.mkdir()
    crew.settings.repo_roots = str(other_root)
    good = code_change(calc_repo, [{"files": {"calc.py": RIGHT}}])
    cases = {
        "unknown field": {**good, "colour": "red"},
        "bad type": {**good, "budget": {"max_attempts": "lots"}},
        "missing repo": {**good, "repo": {"url": str(tmp_path / "nope"), "ref": "main"}},
        "outside roots": good,
        "escaping relative path": {**good, "repo": {"url": "../repo", "ref": "main"}},
        "missing ref": {**good, "repo": {"url": "repo", "ref": "no-such-branch"}},
        "unknown agent": {**good, "agent": {"name": "nobody"}},
        "bad agent config": {**good, "agent": {"name": "scripted", "config": {"files": {"../x": "y"}}}},
        "not an object": ["a", "list"],
    }
    (other_root / "repo").symlink_to(calc_repo)
    async with ApiServer(crew.settings) as api, api.client(key) as c:
        for name, body in cases.items():
            r = await c.post("/v1/work-items", json=body)
            assert r.status_code == 422, (name, r.status_code, r.text)
            problem = r.json()
            assert problem["code"] in ("invalid_work_item", "invalid_request") and problem["detail"], name
        r = await c.post("/v1/work-items", headers={"Content-Type": "application/json"}, content=b"{not json")
        assert r.status_code == 422
    principal = await crew.store.authenticate(key)
    assert principal is not None
    assert await crew.store.list_work_items(principal.tenant_id) == [], "nothing may be stored for a rejection"


async def test_auth_and_tenant_isolation(crew: Crew) -> None:
    _k1, key_a = await crew.store.create_api_key("tenant-a")
    kid_b, key_b = await crew.store.create_api_key("tenant-b")
    async with ApiServer(crew.settings) as api, httpx.AsyncClient(base_url=api.url) as c:
        a = {"Authorization": f"Bearer {key_a}"}
        b = {"Authorization": f"Bearer {key_b}"}
        assert (await c.get("/v1/work-items")).status_code == 401
        assert (await c.get("/v1/work-items", headers={"Authorization": "Bearer cw_wrong"})).status_code == 401
        r = await c.post(
            "/v1/work-items",
            headers=a,
            json={"kind": "task", "input": {}, "agent": {"config": {"output": {"x": 1}}}},
        )
        wid = r.json()["id"]
        for path in ("", "/events", "/cancel", "/review"):
            method = "POST" if path in ("/cancel", "/review") else "GET"
            rr = await c.request(
                method,
                f"/v1/work-items/{wid}{path}",
                headers=b,
                json={"action": "approve"} if path == "/review" else None,
            )
            assert rr.status_code == 404, (path, rr.status_code)
        assert (await c.get("/v1/work-items", headers=b)).json()["items"] == []
        await crew.store.revoke_api_key(kid_b)
        assert (await c.get("/v1/work-items", headers=b)).status_code == 401
        await crew.result(wid)


async def test_same_idempotency_key_returns_the_same_work_item(crew: Crew) -> None:
    _kid, key = await crew.store.create_api_key("idempotent")
    body = {"kind": "task", "input": {}, "agent": {"config": {"output": {}}}}
    async with ApiServer(crew.settings) as api, api.client(key, headers={"Idempotency-Key": "order-17"}) as c:
        r1 = await c.post("/v1/work-items", json=body)
        r2 = await c.post("/v1/work-items", json=body)
        assert (r1.status_code, r2.status_code) == (202, 200)
        assert r1.json()["id"] == r2.json()["id"] and r2.json()["created"] is False
        await crew.result(r1.json()["id"])
