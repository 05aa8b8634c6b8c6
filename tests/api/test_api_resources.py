"""The v1 resources end to end: idempotent submit, a reviewed code change with its evidence, diff and artifacts,
hotfix intake, list filters, keyset pagination under concurrent inserts, and /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.models import WorkItemSpec
from tests.api.conftest import Stack, task_item, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

VALIDATION = {
    "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
    "test_files": ["tests/test_calc.py"],
}


async def test_same_idempotency_key_returns_the_same_work_item(stack: Stack) -> None:
    async with stack.client() as c:
        first = await c.post("/v1/work-items", json=task_item(), headers={"Idempotency-Key": "abc-1"})
        again = await c.post("/v1/work-items", json=task_item(), headers={"Idempotency-Key": "abc-1"})
        assert (first.status_code, again.status_code) == (202, 200)
        assert first.json()["id"] == again.json()["id"] and again.json()["created"] is False


async def test_bad_submissions_are_problems_with_field_errors(stack: Stack) -> None:
    async with stack.client() as c:
        r = await c.post("/v1/work-items", json={"kind": "task", "input": {}, "surprise": 1})
        assert r.status_code == 422 and r.json()["code"] == "invalid_request"
        assert any(e["field"] == "surprise" for e in r.json()["errors"])
        r = await c.post(
            "/v1/work-items", content=b"x" * (1024 * 1024 + 1), headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        r = await c.get("/v1/work-items", params={"cursor": "not-a-cursor"})
        assert r.status_code == 400 and r.json()["code"] == "invalid_cursor"
        r = await c.get("/v1/work-items", params={"label": "novalue"})
        assert r.status_code == 400 and r.json()["code"] == "invalid_label_filter"


async def test_reviewed_code_change_exposes_evidence_diff_and_artifacts(stack: Stack, calc_repo: Path) -> None:
    spec = {
        "kind": "code_change",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Fix add()",
        "validation": VALIDATION,
        "agent": {
            "name": "scripted",
            "config": {"attempts": [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]},
        },
        "review": {"required": True},
        "labels": {"team": "payments"},
    }
    async with stack.client() as c:
        wid = (await c.post("/v1/work-items", json=spec)).json()["id"]
        await wait_state(c, wid, {"awaiting_review"}, timeout_s=120)

        evidence = (await c.get(f"/v1/work-items/{wid}/evidence")).json()
        assert [e["verdict"] for e in evidence] == ["failed", "passed"]
        assert evidence[0]["validation"]["cause"] == "test_failure"
        assert "diff" in evidence[1]["artifacts"] and "log" in evidence[1]["artifacts"]

        d = await c.get(f"/v1/work-items/{wid}/diff")
        assert d.status_code == 200 and d.headers["content-type"].startswith("text/x-diff")
        assert d.headers["x-crewwork-attempt"] == "2" and "calc.py" in d.text and d.text.startswith("diff --git")
        first = await c.get(f"/v1/work-items/{wid}/diff", params={"attempt": 1})
        assert first.headers["x-crewwork-attempt"] == "1" and first.text != d.text

        arts = (await c.get(f"/v1/work-items/{wid}/artifacts")).json()
        assert arts and all(a["url"].startswith(f"/v1/work-items/{wid}/artifacts/") for a in arts)
        got = await c.get(evidence[1]["artifacts"]["log"])
        assert got.status_code == 200 and got.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in got.headers["content-security-policy"]
        assert len(got.content) == next(a["size"] for a in arts if a["url"] == evidence[1]["artifacts"]["log"])

        r = await c.post(f"/v1/work-items/{wid}/review", json={"action": "approve", "reviewer": "ann"})
        assert r.status_code == 200, r.text
        done = await wait_state(c, wid, {"succeeded", "failed"}, timeout_s=60)
        assert done["state"] == "succeeded" and done["delivery_branch"] == f"crewwork/{wid}"
        late = await c.post(f"/v1/work-items/{wid}/review", json={"action": "approve"})
        assert late.status_code == 409 and late.json()["code"] == "review_not_allowed"

        by_label = (await c.get("/v1/work-items", params={"label": "team=payments"})).json()["items"]
        assert [i["id"] for i in by_label] == [wid]
        assert (await c.get("/v1/work-items", params={"label": "team=other"})).json()["items"] == []


async def test_hotfix_report_becomes_a_hotfix_work_item_with_derived_instruction(stack: Stack, calc_repo: Path) -> None:
    report = {
        "message": "AssertionError: add(-1, -1) returned 0",
        "stack_trace": 'Traceback (most recent call last):\n  File "calc.py", line 2, in add\n    return abs(a) + b\n',
        "repo": {"url": str(calc_repo), "ref": "main"},
        "test_command": ["python", "-m", "pytest", "-q", "tests/test_calc.py"],
        "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": RIGHT}}]}},
    }
    async with stack.client() as c:
        r = await c.post("/v1/hotfix", json=report)
        assert r.status_code == 202, r.text
        item = (await c.get(f"/v1/work-items/{r.json()['id']}", params={"live": "false"})).json()
    spec = WorkItemSpec.model_validate(item["spec"])
    assert spec.kind == "hotfix" and spec.review.required
    assert spec.instruction and "add(-1, -1) returned 0" in spec.instruction and "calc.py" in spec.instruction
    assert spec.validation and spec.validation.command == report["test_command"]
    assert item["labels"]["source"] == "hotfix"


async def test_list_filters_by_state_kind_and_created_range(stack: Stack) -> None:
    async with stack.client(stack.beta) as c:
        a = (await c.post("/v1/work-items", json=task_item(labels={"batch": "x"}))).json()["id"]
        await wait_state(c, a, {"succeeded"})
        item_a = (await c.get(f"/v1/work-items/{a}")).json()
        b = (await c.post("/v1/work-items", json=task_item(labels={"batch": "x"}))).json()["id"]
        item_b = (await c.get(f"/v1/work-items/{b}")).json()

        def ids(page: dict[str, Any]) -> list[str]:
            return [i["id"] for i in page["items"]]

        r = (await c.get("/v1/work-items", params={"label": "batch=x"})).json()
        assert ids(r) == [b, a]
        r = (await c.get("/v1/work-items", params={"label": "batch=x", "created_after": item_b["created_at"]})).json()
        assert ids(r) == [b]
        r = (await c.get("/v1/work-items", params={"label": "batch=x", "created_before": item_b["created_at"]})).json()
        assert ids(r) == [a]
        r = (await c.get("/v1/work-items", params={"label": "batch=x", "state": "succeeded", "kind": "task"})).json()
        assert a in ids(r)
        r = (await c.get("/v1/work-items", params={"q": a[:20]})).json()
        assert a in ids(r)
        assert item_a["kind"] == "task"


async def test_keyset_pagination_stays_exact_under_concurrent_inserts(stack: Stack) -> None:
    store = stack.crew.store
    tid = await store.ensure_tenant(stack.alpha.name)
    spec = WorkItemSpec.model_validate(task_item(labels={"page": "test"}))
    existing = []
    for _ in range(57):
        row, _created = await store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
        existing.append(row.id)

    stop = asyncio.Event()
    inserted: list[str] = []

    async def writer() -> None:
        while not stop.is_set():
            row, _ = await store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
            inserted.append(row.id)
            await asyncio.sleep(0.005)

    task = asyncio.create_task(writer())
    seen: list[str] = []
    created: list[tuple[float, str]] = []
    try:
        async with stack.client() as c:
            cursor = None
            while True:
                params: dict[str, str | int] = {"limit": 7, "label": "page=test"}
                if cursor:
                    params["cursor"] = cursor
                page = (await c.get("/v1/work-items", params=params)).json()
                seen += [i["id"] for i in page["items"]]
                created += [(i["created_at"], i["id"]) for i in page["items"]]
                cursor = page["next_cursor"]
                await asyncio.sleep(0.02)
                if not cursor:
                    break
    finally:
        stop.set()
        await task
    assert inserted, "rows were inserted while paging"
    assert len(seen) == len(set(seen)), "no item appears twice"
    assert set(existing) <= set(seen), "every item that existed before paging began is listed"
    assert created == sorted(created, reverse=True), "strictly newest first across pages"


SUBMITTED = 'crewwork_http_requests_total{method="POST",route="/v1/work-items",status="202"}'


def sample(text: str, series: str) -> float:
    """The value of one series in Prometheus text, 0 if it is not there yet."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


async def test_metrics_exposes_prometheus_text_with_store_projections(stack: Stack) -> None:
    async with stack.client() as c:
        # The API serves the other tests of the module too: this test's submission is the counter's increase.
        before = sample((await c.get("/metrics")).text, SUBMITTED)
        wid = (await c.post("/v1/work-items", json=task_item())).json()["id"]
        await wait_state(c, wid, {"succeeded"})
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    assert "# TYPE crewwork_work_items gauge" in text
    # Label order carries no meaning in the text format (prometheus-client sorts them).
    assert 'crewwork_work_items{kind="task",state="succeeded"}' in text
    assert sample(text, SUBMITTED) == before + 1, text
    assert "crewwork_http_request_duration_seconds_bucket" in text and 'le="+Inf"' in text
    assert 'crewwork_events{type="state_changed"}' in text
