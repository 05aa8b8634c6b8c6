"""Request bodies: JSON the store cannot keep faithfully is a 422 naming the field, never a server error and never
a value stored altered; malformed JSON says where; an incomplete review is a 422, not a conflict.

Python's json accepts `NaN`, `Infinity`, `-Infinity` (not JSON) and `1e999` (JSON, but infinite as a float). A
typed field holding one failed the submission as a 500 (its hash could not be computed); inside `input` or
`agent.config` it was stored as `null`. A key given twice kept only its last value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crewwork.api.service import SubmissionRejected
from crewwork.models import WorkItemSpec
from tests.api.conftest import Stack
from tests.api.test_api_nul_bytes import _Recorder

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

JSON = {"Content-Type": "application/json"}
HOLE = "__number__"


def raw(body: dict[str, Any], literal: str) -> str:
    """`body` as JSON with the string HOLE replaced by `literal`, a number spelled as no JSON encoder would."""
    return json.dumps(body).replace(f'"{HOLE}"', literal)


def _cases(repo: Path) -> list[tuple[str, str, str, str]]:
    """(what, path, raw body, the field the answer must name)."""
    task = {"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {}}}
    code = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add()",
        "validation": {"command": ["python", "-m", "pytest", "-q"]},
    }
    items = "/v1/work-items"
    return [
        ("budget cost", items, raw({**task, "budget": {"max_cost_usd": HOLE}}, "1e999"), "budget.max_cost_usd"),
        ("review timeout", items, raw({**code, "review": {"timeout_s": HOLE}}, "Infinity"), "review.timeout_s"),
        ("wall clock", items, raw({**task, "budget": {"max_wall_clock_s": HOLE}}, "NaN"), "budget.max_wall_clock_s"),
        ("sandbox cpus", items, raw({**task, "sandbox": {"cpus": HOLE}}, "-Infinity"), "sandbox.cpus"),
        (
            "validation timeout",
            items,
            raw({**code, "validation": {**code["validation"], "timeout_s": HOLE}}, "-1e999"),
            "validation.timeout_s",
        ),
        ("input", items, raw({"kind": "task", "input": {"x": HOLE}}, "NaN"), "input.x"),
        ("input list", items, raw({"kind": "task", "input": {"v": [1, 2, HOLE]}}, "-Infinity"), "input.v.2"),
        (
            "agent config",
            items,
            raw({**task, "agent": {"name": "scripted", "config": {"output": {"n": HOLE}}}}, "1E400"),
            "agent.config.output.n",
        ),
        (
            "hotfix budget",
            "/v1/hotfix",
            raw({"message": "boom", "repo": {"url": str(repo)}, "budget": {"max_cost_usd": HOLE}}, "NaN"),
            "budget.max_cost_usd",
        ),
        ("review comment", f"{items}/wi_none/review", raw({"action": "approve", "comment": HOLE}, "NaN"), "comment"),
        (
            "webhook events",
            "/v1/webhooks",
            raw({"url": "http://1.1.1.1/h", "event_types": [HOLE]}, "Infinity"),
            "event_types.0",
        ),
        ("webhook rotation", "/v1/webhooks/wh_none/rotate-secret", raw({"overlap_s": HOLE}, "Infinity"), "overlap_s"),
        (
            "repository environment",
            "/v1/repositories",
            raw({"url": str(repo), "environment": {"setup_timeout_s": HOLE}}, "1e999"),
            "environment.setup_timeout_s",
        ),
    ]


async def test_non_finite_numbers_anywhere_in_any_body_are_refused_with_the_field_and_nothing_is_stored(
    stack: Stack, calc_repo: Path
) -> None:
    bad: list[str] = []
    async with stack.client() as client:
        c = _Recorder(client, bad)
        for what, path, body, field in _cases(calc_repo):
            r = await c.post(path, content=body, headers=JSON)
            if r.status_code != 422:
                bad.append(f"{what}: {r.status_code} {r.text[:300]}")
                continue
            p = r.json()
            if p["code"] != "invalid_number" or p["errors"][0]["field"] != field or field not in p["detail"]:
                bad.append(f"{what}: wanted invalid_number naming {field}, got {p}")
        # A key given twice (the last value silently won), a number too long to read, nesting too deep to parse.
        huge = "1" + "0" * 5000
        for what, body, code in (
            ("duplicate key", '{"kind": "task", "input": {}, "input": {"a": 1}}', "duplicate_key"),
            ("duplicate nested key", '{"kind": "task", "input": {"a": 1, "a": 2}}', "duplicate_key"),
            ("5001-digit integer", raw({"kind": "task", "input": {"n": HOLE}}, huge), "invalid_number"),
            ("nested past the parser", "[" * 200_000 + "]" * 200_000, "too_deeply_nested"),
        ):
            r = await c.post("/v1/work-items", content=body, headers=JSON)
            if r.status_code != 422 or r.json()["code"] != code:
                bad.append(f"{what}: wanted 422 {code}, got {r.status_code} {r.text[:200]}")
        # Query parameters too: `float` takes "nan" and "inf".
        for params in ({"created_after": "nan"}, {"created_before": "inf"}):
            r = await c.get("/v1/work-items", params=params)
            if r.status_code != 422:
                bad.append(f"list {params}: {r.status_code} {r.text[:200]}")
        listed = (await c.get("/v1/work-items", params={"limit": 100})).json()["items"]
        if listed:
            bad.append(f"{len(listed)} refused submission(s) stored anyway: {[i['spec'].get('input') for i in listed]}")
        hooks = (await c.get("/v1/webhooks")).json()
        if hooks:
            bad.append(f"refused webhook stored: {hooks}")
    assert not bad, "\n".join(bad)


async def test_a_submission_from_python_with_a_non_finite_number_is_refused_by_the_service(stack: Stack) -> None:
    spec = WorkItemSpec.model_validate({"kind": "task", "input": {"readings": [1.0, float("nan")]}})
    with pytest.raises(SubmissionRejected) as info:
        await stack.crew.service.submit(stack.crew.tenant_id, spec)
    assert info.value.field == "input.readings.1" and info.value.code == "invalid_number"
    # Typed fields refuse them when the model is built.
    with pytest.raises(ValueError, match="finite"):
        WorkItemSpec.model_validate({"kind": "task", "input": {}, "budget": {"max_cost_usd": float("inf")}})


def test_the_python_client_names_the_field_instead_of_failing_to_encode() -> None:
    from crewwork.client import Client

    with Client("http://127.0.0.1:9", "cw_none") as c, pytest.raises(ValueError, match=r"input\.x: not a finite"):
        c.submit({"kind": "task", "input": {"x": float("inf")}})


async def test_malformed_json_says_where_as_a_person_counts_not_a_character_offset_as_a_field(stack: Stack) -> None:
    async with stack.client() as c:
        r = await c.post("/v1/work-items", content='{"kind": "task",\n "input": {},,}', headers=JSON)
    p = r.json()
    assert r.status_code == 422 and p["code"] == "invalid_request", p
    assert p["errors"][0]["field"] == "", p  # it was "31", the character offset
    assert p["detail"].startswith("the body is not valid JSON:") and "line 2, column 14" in p["detail"], p


async def test_a_body_that_is_not_utf8_is_said_to_be_so_not_a_number_too_long(stack: Stack) -> None:
    """Bytes that are no Unicode text (here a Latin-1 `é` in a string) were answered `invalid_number`: "a number in
    the document is too long: 'utf-8' codec can't decode byte 0xe9" (the decoding error is a ValueError, which the
    check for over-long integers caught)."""
    async with stack.client() as c:
        body = b'{"kind": "task", "input": {"name": "caf\xe9"}, "agent": {"name": "scripted", "config": {}}}'
        r = await c.post("/v1/work-items", content=body, headers=JSON)
    p = r.json()
    assert r.status_code == 422 and p["code"] == "invalid_request", p
    assert "UTF-8" in p["detail"] and "number" not in p["detail"], p


async def test_request_changes_without_a_comment_is_a_422_naming_the_comment(stack: Stack) -> None:
    async with stack.client() as c:
        for body in ({"action": "request_changes"}, {"action": "request_changes", "comment": "  "}):
            r = await c.post("/v1/work-items/wi_none/review", json=body)
            p = r.json()
            assert r.status_code == 422 and p["errors"][0]["field"] == "comment", p
