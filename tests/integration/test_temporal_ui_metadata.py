"""Temporal's Web UI reads without opening payloads: every work item's workflow carries a summary (kind and the
instruction's first line) and details (work item, kind, tenant, agent, repository, instruction) from its start."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from tests.conftest import Crew
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def test_workflow_summary_and_details_are_set_at_start(crew: Crew, calc_repo: Path) -> None:
    item = code_change(calc_repo, [{"files": {"calc.py": RIGHT}}])
    item["instruction"] = "Fix add() in calc.py\n\nThe tests in tests/test_calc.py say how."
    wid = await crew.submit(item)
    row = await crew.store.get_work_item(wid)
    assert row is not None
    desc = await crew.client.get_workflow_handle(row.workflow_id).describe()
    assert await desc.static_summary() == "code_change: Fix add() in calc.py"
    details = await desc.static_details()
    assert details is not None
    for part in (wid, "code_change", row.tenant_id, "scripted", str(calc_repo), "main", "Fix add() in calc.py"):
        assert part in details, (part, details)
    assert "The tests in" not in details, "only the instruction's first line"

    task = await crew.submit({"kind": "task", "input": {}, "agent": {"config": {"output": {}}}})
    trow = await crew.store.get_work_item(task)
    assert trow is not None
    tdesc = await crew.client.get_workflow_handle(trow.workflow_id).describe()
    assert await tdesc.static_summary() == "task: scripted agent"
    await crew.result(wid)
    await crew.result(task)
