"""The review console in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright): sign in, watch
a work item move to awaiting review live, approve it from the page, see it succeed. Screenshots of every page go to
test-artifacts/; with CREWWORK_UPDATE_DOC_IMAGES=1 representative ones are copied to docs/images/."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.temporal.devserver import DevServer
from tests.api.conftest import Stack
from tests.conftest import ApiServer, make_settings, running_crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
VALIDATION = {
    "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
    "test_files": ["tests/test_calc.py"],
}


@asynccontextmanager
async def chromium_page(executable_path: str) -> AsyncIterator[Any]:
    """A page of a fresh headless Chromium, closed afterwards; the test fails if a script of the page raised."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable_path, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1366, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            yield page
        finally:
            await browser.close()
        assert not errors, errors


@pytest.fixture(scope="module")
def chromium_path() -> str:
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed: apt-get install -y chromium")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.skip("playwright (the Python package) is not installed")
    return CHROMIUM


async def test_console_shows_live_progress_and_approving_from_the_page_lands_the_change(
    stack: Stack, calc_repo: Path, chromium_path: str
) -> None:
    from playwright.async_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    spec = {
        "kind": "code_change",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Fix add() so that the tests pass",
        "validation": VALIDATION,
        "agent": {
            "name": "scripted",
            "config": {
                "attempts": [
                    {"files": {"calc.py": WRONG}, "delay_s": 1.5, "claims": "I fixed it"},
                    {"files": {"calc.py": RIGHT}, "delay_s": 1.5, "claims": "Fixed add()"},
                ]
            },
        },
        "review": {"required": True},
        "labels": {"team": "payments", "ticket": "PAY-142"},
    }
    async with stack.client() as c:
        for n in range(2):  # some history in the list
            await c.post("/v1/work-items", json={"kind": "task", "input": {"n": n}, "labels": {"team": "search"}})

    async with chromium_page(chromium_path) as page:
        await page.goto(f"{stack.api.url}/console")
        await page.screenshot(path=str(ARTIFACTS / "console-login.png"))
        await page.get_by_label("API key").fill(stack.alpha.key)
        await page.keyboard.press("Enter")
        # The default view is the review queue; this test follows every state.
        await expect(page.get_by_role("heading", name="Awaiting review")).to_be_visible()
        await page.get_by_role("link", name="Show every state").click()
        await expect(page.get_by_role("heading", name="Work items")).to_be_visible()
        await expect(page.locator("#live-status")).to_have_text("● live", timeout=15_000)

        # Submitted while the list is open: it appears and moves through its states live.
        async with stack.client() as c:
            wid = (await c.post("/v1/work-items", json=spec)).json()["id"]
        row = page.locator(f'tr[data-id="{wid}"]')
        await expect(row).to_be_visible(timeout=15_000)
        await expect(row.locator('[data-state="awaiting_review"]')).to_be_visible(timeout=120_000)
        await page.screenshot(path=str(ARTIFACTS / "console-list.png"), full_page=True)

        # Keyboard: "/" focuses the search box.
        await page.keyboard.press("/")
        await expect(page.locator("#f-search")).to_be_focused()

        await row.locator(".item-link").click()
        await expect(page.locator("h1 [data-state]")).to_have_attribute("data-state", "awaiting_review")
        await expect(page.locator("#evidence-bundle")).to_contain_text("a bundle is signed when the change lands")
        await expect(page.locator(".dv-line.add").first).to_be_visible(timeout=15_000)
        await expect(page.locator(".timeline button")).to_have_count(2)
        await expect(page.locator(".log").first).to_contain_text("passed", timeout=15_000)
        await expect(page.locator(".events li").first).to_be_visible(timeout=15_000)
        href = await page.locator("#temporal-workflow-link").get_attribute("href")
        assert href and href.endswith(f"/workflows/work-item-{wid}")
        await page.screenshot(path=str(ARTIFACTS / "console-detail-review.png"), full_page=True)

        # Evidence of the failed first attempt is one keypress away.
        await page.locator('.timeline button[data-n="1"]').focus()
        await page.keyboard.press("Enter")
        await expect(page.locator("#evidence-1")).to_contain_text("test_failure")
        await page.screenshot(path=str(ARTIFACTS / "console-attempt-evidence.png"), full_page=True)

        # Back on the attempt awaiting review, approve it.
        await page.locator('.timeline button[data-n="2"]').click()
        await expect(page.locator("#approve")).to_be_enabled()
        await page.get_by_role("button", name="Approve attempt 2").click()
        await expect(page.locator("h1 [data-state]")).to_have_attribute("data-state", "succeeded", timeout=60_000)
        await expect(page.locator(".events")).to_contain_text("succeeded")
        # No signing key here: the landing is unsigned, and the page says so where it shows the item's evidence.
        await expect(page.locator("#evidence-bundle")).to_contain_text("UNSIGNED: landed while no evidence signing key")
        await page.screenshot(path=str(ARTIFACTS / "console-detail-succeeded.png"), full_page=True)

        # The workers view needs the admin scope.
        await page.goto(f"{stack.api.url}/console#/workers")
        await expect(page.get_by_text("admin scope")).to_be_visible()
        await page.evaluate("k => sessionStorage.setItem('crewwork.apiKey', k)", stack.admin.key)
        await page.reload()
        await expect(page.get_by_role("table", name="Task queues")).to_be_visible(timeout=15_000)
        await expect(page.locator("td", has_text="control").first).to_be_visible()
        await page.screenshot(path=str(ARTIFACTS / "console-workers.png"), full_page=True)

    async with stack.client() as c:
        item = (await c.get(f"/v1/work-items/{wid}")).json()
    assert item["state"] == "succeeded" and item["delivery_branch"] == f"crewwork/{wid}"

    if os.environ.get("CREWWORK_UPDATE_DOC_IMAGES"):  # refresh the screenshots committed under docs/images
        images = Path(__file__).resolve().parents[2] / "docs" / "images"
        images.mkdir(parents=True, exist_ok=True)
        for name in ("console-list.png", "console-detail-review.png", "console-workers.png"):
            shutil.copy(ARTIFACTS / name, images / name)


async def test_a_queued_items_page_says_its_workflow_has_not_started_yet(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, chromium_path: str
) -> None:
    """A queued item has no workflow until its place comes (crewwork/admission/starts.py): its page says so beside the
    Temporal UI link (which finds nothing yet); a running item's page does not."""
    from playwright.async_api import expect

    settings = make_settings(tmp_path, temporal_server, pg_url, tenant_max_in_flight=1)
    task = {"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {"output": {}, "delay_s": 20}}}
    async with running_crew(settings, pools=("control", "agent")) as crew:
        _kid, key = await crew.store.create_api_key("console-queue")
        async with ApiServer(settings) as api, api.client(key) as c:
            running = (await c.post("/v1/work-items", json=task)).json()["id"]
            queued = (await c.post("/v1/work-items", json=task)).json()
            assert queued["state"] == "queued", queued
            await crew.wait_state(running, "running")
            async with chromium_page(chromium_path) as page:
                await page.goto(f"{api.url}/console")
                await page.get_by_label("API key").fill(key)
                await page.keyboard.press("Enter")
                await expect(page.get_by_role("heading", name="Awaiting review")).to_be_visible()
                await page.goto(f"{api.url}/console#/items/{queued['id']}")
                await expect(page.locator("h1 [data-state]")).to_have_attribute("data-state", "queued")
                await expect(page.locator("#workflow-not-started")).to_be_visible()
                await page.goto(f"{api.url}/console#/items/{running}")
                await expect(page.locator("h1 [data-state]")).to_have_attribute("data-state", "running")
                await expect(page.locator("#temporal-workflow-link")).to_be_visible()
                await expect(page.locator("#workflow-not-started")).to_have_count(0)
            for wid in (running, queued["id"]):
                await c.post(f"/v1/work-items/{wid}/cancel")
            for wid in (running, queued["id"]):
                await crew.wait_state(wid, "cancelled", timeout_s=60)


async def test_the_console_shows_why_a_tampered_report_was_not_believed(
    stack: Stack, calc_repo: Path, chromium_path: str
) -> None:
    """Issue 45: an attempt whose code under test rewrites failing reports (a hook hidden from the scan) and silences a
    linter is `suspected_tampering`; its evidence says why, and what the change weakens, as text on the page."""
    from playwright.async_api import expect

    from tests.security.test_runner_tampering import HIDDEN

    ARTIFACTS.mkdir(exist_ok=True)
    calc = "import os  # noqa: F401\n\n\n" + WRONG + HIDDEN
    spec = {
        "kind": "code_change",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Fix add() so that the tests pass",
        "validation": VALIDATION,
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
        await expect(evidence).to_contain_text("suspected_tampering")
        doubts = evidence.get_by_role("region", name="Why the report was not believed, attempt 1")
        await expect(doubts).to_contain_text("the report says passed, the witness saw it failed")
        weakened = evidence.get_by_role("region", name="Checks the change weakens instead of satisfying, attempt 1")
        await expect(weakened).to_contain_text("calc.py:1: silences a linter: import os  # noqa: F401")
        await page.screenshot(path=str(ARTIFACTS / "console-suspected-tampering.png"), full_page=True)


async def test_the_console_marks_a_pre_existing_failure_and_shows_the_baseline(
    stack: Stack, tmp_path: Path, chromium_path: str
) -> None:
    """Issue 45, item 2: a repository whose legacy test fails before any change; the change fixes add() and passes
    with `validation.baseline: compare`. The page names the legacy test as pre-existing, add's test as fixed, and the
    baseline run with its log."""
    from playwright.async_api import expect

    from tests.conftest import make_repo
    from tests.validation.test_baseline import BUGGY, FIXED, LEGACY, LEGACY_ID, TESTS

    ARTIFACTS.mkdir(exist_ok=True)
    repo = make_repo(
        tmp_path / "legacy-repo",
        {"calc.py": BUGGY, "tests/test_calc.py": TESTS, "tests/test_legacy.py": LEGACY, "conftest.py": ""},
    )
    spec = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() so that the tests pass",
        "validation": {**VALIDATION, "test_files": [], "baseline": "compare"},
        "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": FIXED}}]}},
        "budget": {"max_attempts": 1},
        "review": {"required": False},
    }
    async with stack.client() as c:
        r = await c.post("/v1/repositories", json={"url": str(repo)})
        assert r.status_code in (200, 201), r.text
        wid = (await c.post("/v1/work-items", json=spec)).json()["id"]
    async with chromium_page(chromium_path) as page:
        await page.goto(f"{stack.api.url}/console")
        await page.get_by_label("API key").fill(stack.alpha.key)
        await page.keyboard.press("Enter")
        await page.goto(f"{stack.api.url}/console#/items/{wid}")
        await expect(page.locator("h1 [data-state]")).to_have_attribute("data-state", "succeeded", timeout=180_000)
        await page.locator('.timeline button[data-n="1"]').click()
        evidence = page.locator("#evidence-1")
        pre = evidence.get_by_role(
            "region", name="Pre-existing: failing at the base commit too (not the change's fault), attempt 1"
        )
        await expect(pre).to_contain_text(LEGACY_ID)
        fixed = evidence.get_by_role(
            "region", name="Fixed: failing at the base commit, passing after the change, attempt 1"
        )
        await expect(fixed).to_contain_text("tests/test_calc.py::test_add")
        baseline = evidence.get_by_role("region", name="Baseline on the base commit, attempt 1")
        await expect(baseline).to_contain_text("3 tests ran, 2 failing (validation.baseline: compare)")
        await expect(baseline.get_by_role("link", name="log")).to_be_visible()
        await page.screenshot(path=str(ARTIFACTS / "console-baseline-pre-existing.png"), full_page=True)
