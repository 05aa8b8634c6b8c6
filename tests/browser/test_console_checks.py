"""The console shows each named check of an attempt (validation.checks, docs/checks.md): its verdict, cause, reason,
findings and downloads, as text whatever the check printed. Screenshot to test-artifacts/ (docs/images/ with
CREWWORK_UPDATE_DOC_IMAGES=1)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from tests.api.conftest import Stack
from tests.browser.axe import assert_accessible
from tests.browser.test_console_browser import ARTIFACTS, VALIDATION, chromium_page
from tests.browser.test_console_browser import chromium_path as chromium_path

pytestmark = [pytest.mark.postgres, pytest.mark.temporal, pytest.mark.browser]

DOC_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


async def test_an_attempts_checks_are_shown_with_their_findings(
    stack: Stack, calc_repo: Path, chromium_path: str
) -> None:
    from playwright.async_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    lint = "echo 'calc.py:2:5: E999 <img src=x onerror=alert(1)> looks wrong'; exit 1"
    spec = {
        "kind": "code_change",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Fix add() so that the tests pass",
        "validation": {
            **VALIDATION,
            "checks": [
                {"name": "lint", "command": ["sh", "-c", lint]},
                {"name": "types", "command": ["true"]},
                {"name": "docs", "command": ["sh", "-c", "exit 2"], "required": False},
            ],
        },
        "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": RIGHT}}]}},
        "budget": {"max_attempts": 1},
        "review": {"required": False},
    }
    async with stack.client() as c:
        wid = (await c.post("/v1/work-items", json=spec)).json()["id"]
    async with chromium_page(chromium_path) as page:
        await page.goto(f"{stack.api.url}/console")
        await page.get_by_label("API key").fill(stack.alpha.key)
        await page.keyboard.press("Enter")
        await page.goto(f"{stack.api.url}/console#/items/{wid}")
        await expect(page.locator("h1 [data-state]")).to_have_attribute("data-state", "failed", timeout=120_000)
        await page.locator('.timeline button[data-n="1"]').click()
        evidence = page.locator("#evidence-1")
        await expect(evidence).to_contain_text("check_failed")
        checks = evidence.get_by_role("table", name="Checks of attempt 1")
        await expect(evidence.get_by_role("region", name="Checks, attempt 1")).to_contain_text("Checks (1 of 3 passed)")
        row = checks.locator('tr[data-check="lint"]')
        await expect(row).to_contain_text("failed")
        await expect(row).to_contain_text("check_failed")
        # The check's output is shown as text: the markup it printed is not markup on the page.
        await expect(row).to_contain_text("calc.py:2:5: E999 <img src=x onerror=alert(1)> looks wrong")
        assert await row.locator("img").count() == 0
        await expect(checks.locator('tr[data-check="types"]')).to_contain_text("passed")
        await expect(checks.locator('tr[data-check="docs"]')).to_contain_text("(not required)")
        await expect(row.get_by_role("link", name="log")).to_be_visible()
        await assert_accessible(page, "an attempt with checks")
        shot = ARTIFACTS / "console-checks.png"
        await evidence.screenshot(path=str(shot))
        if os.environ.get("CREWWORK_UPDATE_DOC_IMAGES"):
            shutil.copy(shot, DOC_IMAGES / shot.name)
