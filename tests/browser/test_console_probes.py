"""The preview through the API and the console: a bad `validation.preview` is a 422 naming the field, and the
console shows an attempt's acceptance probes next to its tests (verdicts, what was expected and seen, console
errors, the screenshot). Screenshots go to test-artifacts/ (docs/images/ with CREWWORK_UPDATE_DOC_IMAGES=1)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.api.conftest import Stack, wait_state
from tests.browser.test_console_browser import ARTIFACTS, CHROMIUM, chromium_page
from tests.conftest import make_repo
from tests.preview.test_repair import INDEX, JS, JS_FIXED, PYTEST, SITE_TEST

pytestmark = [pytest.mark.postgres, pytest.mark.temporal, pytest.mark.browser]


def site_item(repo: Path, preview: object) -> dict[str, object]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Clicking Add does nothing",
        "validation": {"command": ["python3", *PYTEST[1:]], "junit_path": ".crewwork/junit.xml", "preview": preview},
        "agent": {
            "name": "scripted",
            "config": {
                "attempts": [
                    {"files": {"index.html": INDEX.replace("<title>Counter", "<title>The counter")}},
                    {"files": {"app.js": JS_FIXED}},
                ]
            },
        },
        "review": {"required": True},
    }


async def test_a_bad_preview_is_a_422_naming_the_field(stack: Stack, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "site", {"index.html": INDEX, "app.js": JS, "tests/test_site.py": SITE_TEST})
    async with stack.client() as c:
        for preview, field in [
            ({"http": [{"name": "home", "path": "https://evil.example/"}]}, "validation.preview.http.0.path"),
            ({"browser": [{"name": "f", "steps": [{"click": {"css": "#add"}}]}]}, "validation.preview.browser.0.steps.0.click.click.css"),
            ({"http": [{"name": "home", "expect": [{"regex": "(a)\\1"}]}]}, "validation.preview.http.0.expect.0.regex.regex"),
        ]:  # fmt: skip
            r = await c.post("/v1/work-items", json=site_item(repo, preview))
            assert r.status_code == 422, r.text
            assert field in [e["field"] for e in r.json()["errors"]], r.json()


async def test_the_console_shows_the_probe_evidence_next_to_the_tests(stack: Stack, tmp_path: Path) -> None:
    from playwright.async_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    repo = make_repo(tmp_path / "site", {"index.html": INDEX, "app.js": JS, "tests/test_site.py": SITE_TEST})
    preview = {
        "browser": [
            {
                "name": "add-one",
                "steps": [{"open": "/"}, {"click": {"role": "button", "name": "Add"}}],
                "expect": [{"text_visible": "Count: 1"}, {"no_console_errors": True}],
            }
        ],
        "http": [{"name": "home", "path": "/", "expect": [{"contains": "<button"}]}],
    }
    async with stack.client() as c:
        r = await c.post("/v1/work-items", json=site_item(repo, preview))
        assert r.status_code == 202, r.text
        wid = r.json()["id"]
        await wait_state(c, wid, {"awaiting_review"}, timeout_s=300)

    async with chromium_page(CHROMIUM) as page:
        await page.goto(f"{stack.api.url}/console")
        await page.evaluate("k => sessionStorage.setItem('crewwork.apiKey', k)", stack.alpha.key)
        await page.goto(f"{stack.api.url}/console#/items/{wid}")
        await page.locator('.timeline button[data-n="1"]').click()
        probes = page.get_by_role("region", name="Acceptance probes of attempt 1")
        await expect(probes).to_contain_text("probe_failure", timeout=15_000)
        await expect(probes).to_contain_text("preview::browser::add-one")
        await expect(probes).to_contain_text("expected: text visible 'Count: 1'")
        await expect(probes).to_contain_text("Cannot set properties of null")
        await expect(probes.locator("figure img")).to_have_attribute(
            "src", re.compile("^data:image/png"), timeout=15_000
        )
        await page.wait_for_function("() => document.querySelector('figure img').naturalWidth > 0")
        width = await probes.locator("figure img").evaluate("img => img.naturalWidth")
        assert width == 1280, "the flow's screenshot is shown"
        await probes.scroll_into_view_if_needed()
        await page.wait_for_function("() => document.querySelector('figure img').naturalWidth > 0")
        await page.screenshot(path=str(ARTIFACTS / "console-probe-page.png"), full_page=True)
        await page.locator("#evidence-1").screenshot(path=str(ARTIFACTS / "console-probe-evidence.png"))
        await page.locator('.timeline button[data-n="2"]').click()
        await expect(page.get_by_role("region", name="Acceptance probes of attempt 2")).to_contain_text("passed")
        await page.screenshot(path=str(ARTIFACTS / "console-probe-passed.png"), full_page=True)
    if os.environ.get("CREWWORK_UPDATE_DOC_IMAGES"):
        shutil.copy(ARTIFACTS / "console-probe-evidence.png", Path(__file__).resolve().parents[2] / "docs" / "images")
