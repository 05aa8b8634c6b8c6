"""The console shows a security scanner's finding on the diff's line it is about, and in the attempt's evidence
(docs/scanners.md). Screenshot to test-artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from tests.api.conftest import Stack
from tests.browser.test_console_browser import ARTIFACTS, VALIDATION, chromium_page
from tests.browser.test_console_browser import chromium_path as chromium_path

pytestmark = [pytest.mark.postgres, pytest.mark.temporal, pytest.mark.browser]


async def test_a_secret_the_change_adds_is_shown_on_its_line_of_the_diff(
    stack: Stack, calc_repo: Path, chromium_path: str
) -> None:
    from playwright.async_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    calc = RIGHT + '\nAWS_ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLQ"\n'
    line = len(calc.splitlines())
    spec = {
        "kind": "code_change",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Fix add() so that the tests pass",
        "validation": {**VALIDATION, "scanners": {}},
        "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": calc}}]}},
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
        await expect(evidence).to_contain_text("security_finding")
        found = evidence.get_by_role("region", name="Security scanner findings, attempt 1")
        await expect(found).to_contain_text(f"calc.py:{line}: secrets AWS Access Key [blocks]")
        note = page.get_by_role("note", name=f"Scanner finding on calc.py line {line}")
        await expect(note).to_contain_text("AWS Access Key")
        await expect(note).to_contain_text("Scanner secrets (blocks)")
        await page.screenshot(path=str(ARTIFACTS / "console-scanner-finding.png"), full_page=True)
