"""Untrusted paths are refused at the API edge: a 422 problem that names the field, before anything is stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import Stack, api_crew, api_settings, shared_api, stack  # noqa: F401  (fixtures)
from tests.security.conftest import RIGHT, VALIDATION, code_change, scripted

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def test_bad_paths_are_422_problems_naming_the_field(stack: Stack, calc: Path) -> None:  # noqa: F811
    bad = {
        "validation.junit_path": code_change(
            calc, scripted({"files": {"calc.py": RIGHT}}), {**VALIDATION, "junit_path": "/root/x"}
        ),
        "validation.test_files.0": code_change(
            calc, scripted({"files": {"calc.py": RIGHT}}), {**VALIDATION, "test_files": ["a/../.git/config"]}
        ),
        "agent": code_change(calc, scripted({"files": {"./.git/config": "[core]\n"}})),
    }
    async with stack.client() as c:
        for field, body in bad.items():
            r = await c.post("/v1/work-items", json=body)
            assert r.status_code == 422, (field, r.text)
            problem = r.json()
            assert any(e["field"] == field for e in problem.get("errors", [])), (field, problem)
            assert ".git" in problem["detail"] or "absolute" in problem["detail"], problem
        listed = await c.get("/v1/work-items")
        assert listed.status_code == 200 and listed.json()["items"] == []
