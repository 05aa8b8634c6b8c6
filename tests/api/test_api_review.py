"""Review through the API, end to end on the real stack: a decision is a fact of the item (its `review_decided` event,
the item's `reviews`, a `work_item.reviewed` webhook, the landed commit's trailer, `crewwork status`); a decision on
an attempt that no longer awaits review is refused as stale; line comments reach the next attempt with file and
line; the diff comes as files, hunks and numbered lines."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.cli.render import render_item
from crewwork.config import Settings
from crewwork.store.tables import OutboxMessage
from tests.api.conftest import LiveApi, Stack, wait_state
from tests.integration.test_lifecycle import VALIDATION

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

DOCSTRING = RIGHT.replace("def add(a, b):\n", 'def add(a, b):\n    """The sum of a and b."""\n')


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    # The webhook registered here points at loopback, which a webhook may reach only where the operator allows it.
    return api_settings.model_copy(update={"outbound_allow_networks": "127.0.0.0/8"})


def reviewed_item(repo: Path, *steps: str) -> dict[str, object]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() so that adding two numbers returns their sum instead of their difference\n\n"
        "The second line is not part of the subject.",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": s}} for s in steps]}},
        "review": {"required": True},
        "budget": {"max_attempts": 4},
    }


async def awaiting_attempt(c: httpx.AsyncClient, wid: str, attempt: int, timeout_s: float = 120) -> dict[str, Any]:
    """Until attempt `attempt` awaits review (the item is awaiting review with that many attempts recorded)."""
    deadline = time.monotonic() + timeout_s
    item: dict[str, Any] = {}
    while time.monotonic() < deadline:
        item = (await c.get(f"/v1/work-items/{wid}")).json()
        if item["state"] == "awaiting_review" and (item.get("under_review") or {}).get("attempt") == attempt:
            return item
        await asyncio.sleep(0.2)
    raise AssertionError(f"attempt {attempt} of {wid} never awaited review: {item.get('state')}")


async def test_decisions_are_recorded_refused_when_stale_and_reach_the_next_attempt(
    stack: Stack, calc_repo: Path
) -> None:
    async with stack.client() as c:
        hook = (await c.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"})).json()
        wid = (await c.post("/v1/work-items", json=reviewed_item(calc_repo, RIGHT, DOCSTRING))).json()["id"]
        item = await wait_state(c, wid, {"awaiting_review"}, timeout_s=120)
        item = (await c.get(f"/v1/work-items/{wid}")).json()
        assert item["under_review"]["attempt"] == 1 and item["title"].startswith("Fix add()")
        assert item["checks"]["tests_executed"] == 2 and item["checks"]["tests_failed"] == 0

        # The diff as the console draws it: files, hunks, numbered lines; its sha256 is what a decision pins.
        model = (await c.get(f"/v1/work-items/{wid}/diff", params={"format": "json"})).json()
        assert model["attempt"] == 1 and model["sha256"] == item["under_review"]["diff_sha256"]
        (calc,) = model["files"]
        assert (calc["path"], calc["additions"], calc["deletions"]) == ("calc.py", 1, 1)
        added = next(ln for h in calc["hunks"] for ln in h["lines"] if ln["kind"] == "add")
        assert added["text"] == "    return a + b" and added["new"] == 2

        # What is incomplete is a 422 naming the field, whatever the state.
        r = await c.post(f"/v1/work-items/{wid}/review", json={"action": "reject", "attempt": 1})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "comment", r.text
        r = await c.post(f"/v1/work-items/{wid}/review", json={"action": "request_changes", "attempt": 1})
        assert r.status_code == 422, r.text

        r = await c.post(
            f"/v1/work-items/{wid}/review",
            json={
                "action": "request_changes",
                "attempt": 1,
                "diff_sha256": model["sha256"],
                "reviewer": "bob",
                "comment": "Document add().",
                "line_comments": [{"path": "calc.py", "line": 2, "body": "A docstring above this line, please."}],
            },
        )
        assert r.status_code == 200, r.text
        item = await awaiting_attempt(c, wid, 2)

        # A reviewer who still looks at attempt 1 is refused, and told which attempt waits.
        r = await c.post(f"/v1/work-items/{wid}/review", json={"action": "approve", "attempt": 1})
        assert r.status_code == 409 and r.json()["code"] == "review_stale", r.text
        assert "attempt 2 is the one awaiting review" in r.json()["detail"]

        # The line comment reached attempt 2's agent with its file and line, quoted as the reviewer's input.
        evidence = (await c.get(f"/v1/work-items/{wid}/evidence")).json()
        transcript = (await c.get(evidence[1]["artifacts"]["transcript"])).text
        assert "Reviewer input on attempt 1 from bob (API key" in transcript
        assert "- calc.py:2\\n> A docstring above this line, please." in transcript

        r = await c.post(
            f"/v1/work-items/{wid}/review",
            json={"action": "approve", "attempt": 2, "reviewer": "alice", "comment": "LGTM"},
        )
        assert r.status_code == 200, r.text
        done = await wait_state(c, wid, {"succeeded", "failed"}, timeout_s=60)
        assert done["state"] == "succeeded", done["reason"]
        item = (await c.get(f"/v1/work-items/{wid}")).json()

    reviews = item["reviews"]
    assert [(r["action"], r["attempt"], r["reviewer"]) for r in reviews] == [
        ("request_changes", 1, "bob"),
        ("approve", 2, "alice"),
    ]
    assert all(r["api_key_id"] == stack.alpha.key_id for r in reviews)
    assert reviews[0]["line_comments"][0]["path"] == "calc.py"
    assert reviews[1]["summary"].startswith(f"alice (API key {stack.alpha.key_id}) approved attempt 2 at ")
    assert item["result"]["review"]["action"] == "approve"

    # crewwork status says the same.
    text = render_item(item)
    assert f"bob (API key {stack.alpha.key_id}) requested changes to attempt 1" in text
    assert "calc.py:2  A docstring above this line, please." in text and "approved attempt 2" in text

    # The landed commit: the instruction's first line as its subject (not cut mid-word), and who approved it.
    message = subprocess.run(
        ["git", "log", "-1", "--format=%B", f"crewwork/{wid}"], cwd=calc_repo, capture_output=True, text=True
    ).stdout
    subject = message.splitlines()[0]
    assert subject.startswith("Fix add() so that adding two numbers returns") and subject.endswith("…")
    assert len(subject) <= 72 and subject[:-1] in reviewed_item(calc_repo)["instruction"]  # type: ignore[operator]
    assert f"Reviewed-by: alice (API key {stack.alpha.key_id})" in message and "Crewwork-Attempt: 2" in message

    # Each decision went to the tenant's webhook, in the same transaction as its event.
    async with stack.crew.store.session() as s:
        rows = (
            await s.scalars(
                select(OutboxMessage).where(
                    OutboxMessage.webhook_id == hook["id"], OutboxMessage.event_type == "work_item.reviewed"
                )
            )
        ).all()
    assert [(m.payload["review"]["action"], m.payload["review"]["attempt"]) for m in rows] == [
        ("request_changes", 1),
        ("approve", 2),
    ]


async def test_a_rejection_names_who_and_why_and_the_queue_finds_it(stack: Stack, calc_repo: Path) -> None:
    async with stack.client() as c:
        wid = (await c.post("/v1/work-items", json=reviewed_item(calc_repo, WRONG, RIGHT))).json()["id"]
        await wait_state(c, wid, {"awaiting_review"}, timeout_s=120)
        page = (await c.get("/v1/work-items", params={"state": "awaiting_review", "agent": "scripted"})).json()
        row = next(i for i in page["items"] if i["id"] == wid)
        assert row["checks"]["attempt"] == 2 and row["checks"]["insertions"] == 1 and row["waiting_since"]
        assert (await c.get("/v1/work-items", params={"agent": "model"})).json()["items"] == []
        assert [i["id"] for i in (await c.get("/v1/work-items", params={"q": "adding two numbers"})).json()["items"]]
        r = await c.post(
            f"/v1/work-items/{wid}/review", json={"action": "reject", "attempt": 2, "comment": "Not this way."}
        )
        assert r.status_code == 200, r.text
        done = await wait_state(c, wid, {"rejected"}, timeout_s=60)
    assert done["reason"] == f"rejected by reviewer API key {stack.alpha.key_id}: Not this way."


async def test_an_operator_can_refuse_reviewer_names(stack: Stack, api_settings: Settings) -> None:
    api = LiveApi(api_settings.model_copy(update={"review_names": False})).start()
    try:
        async with httpx.AsyncClient(base_url=api.url, headers=stack.alpha.headers) as c:
            r = await c.post("/v1/work-items/wi_none/review", json={"action": "approve", "reviewer": "mallory"})
    finally:
        api.stop()
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "reviewer", r.text
