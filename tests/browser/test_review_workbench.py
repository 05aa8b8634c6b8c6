"""The reviewer's workbench in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright): the review
queue and its keyboard, line comments that reach the next attempt, the next attempt's change against the one sent
back with the comments beside their lines, decisions by name on the item's timeline, a stale approval refused, a
rejection that asks for a reason, a 300-line diff, a 390 px window, and the API stopped and started again under an
open console. Every page is checked with axe-core (no serious or critical violation); screenshots go to
test-artifacts/ (with CREWWORK_UPDATE_DOC_IMAGES=1 the documented ones are copied to docs/images/)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.cli.demo import RIGHT
from tests.api.conftest import Stack, wait_state
from tests.browser.axe import assert_accessible
from tests.browser.test_console_browser import ARTIFACTS, CHROMIUM, VALIDATION, chromium_page

pytestmark = [pytest.mark.postgres, pytest.mark.temporal, pytest.mark.browser]

DOCSTRING = RIGHT.replace("def add(a, b):\n", 'def add(a, b):\n    """The sum of a and b."""\n')
DOC_IMAGES = {
    "review-queue.png",
    "review-line-comment.png",
    "review-compare.png",
    "review-timeline.png",
    "review-stale-refused.png",
    "review-300-line-diff.png",
    "review-300-line-diff-end.png",
    "console-connection-lost.png",
}


def reviewed(
    repo: Path, *steps: dict[str, Any], instruction: str = "Fix add() so that it returns the sum"
) -> dict[str, Any]:
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": instruction,
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": list(steps)}},
        "review": {"required": True},
        "labels": {"team": "payments"},
        "budget": {"max_attempts": 4},
    }


async def awaiting(c: httpx.AsyncClient, wid: str, attempt: int, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    item: dict[str, Any] = {}
    while time.monotonic() < deadline:
        item = (await c.get(f"/v1/work-items/{wid}")).json()
        if item["state"] == "awaiting_review" and (item.get("under_review") or {}).get("attempt") == attempt:
            return item
        await asyncio.sleep(0.25)
    raise AssertionError(f"attempt {attempt} of {wid} never awaited review: {item.get('state')} {item.get('reason')}")


async def sign_in(page: Any, url: str, key: str, where: str = "") -> None:
    await page.goto(f"{url}/console")
    await page.evaluate("k => sessionStorage.setItem('crewwork.apiKey', k)", key)
    await page.goto(f"{url}/console#{where or '/'}")


def setup_module() -> None:
    from playwright.async_api import expect

    # A page's first draw waits on real attempts' diffs and logs; on a loaded 2-core machine that is seconds.
    expect.set_options(timeout=20_000)


def shot(name: str) -> str:
    ARTIFACTS.mkdir(exist_ok=True)
    return str(ARTIFACTS / name)


async def test_a_reviewer_triages_comments_on_lines_and_approves_by_name(stack: Stack, calc_repo: Path) -> None:
    from playwright.async_api import expect

    async with stack.client() as c:
        wid = (
            await c.post(
                "/v1/work-items",
                json=reviewed(calc_repo, {"files": {"calc.py": RIGHT}}, {"files": {"calc.py": DOCSTRING}}),
            )
        ).json()["id"]
        await c.post(
            "/v1/work-items",
            json={"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {"output": {}}}},
        )
        await awaiting(c, wid, 1)

    async with chromium_page(CHROMIUM) as page:
        await sign_in(page, stack.api.url, stack.alpha.key)
        # The default view is what waits for review, with what a reviewer triages by.
        await expect(page.get_by_role("heading", name="Awaiting review")).to_be_visible()
        row = page.locator(f'tr[data-id="{wid}"]')
        await expect(row.locator(".item-link")).to_have_text("Fix add() so that it returns the sum")
        await expect(row.locator(".badge.mock")).to_be_visible()
        await expect(row.locator(".cell-checks")).to_contain_text("2 tests passed")
        await expect(row.locator(".cell-diff")).to_contain_text("+1")
        await expect(row.locator(".cell-waiting")).not_to_be_empty()
        await expect(page.locator("tr[data-id]")).to_have_count(1)  # the task that succeeded is not in the queue
        await expect(page.locator("#live-status")).to_have_text("● live", timeout=15_000)
        await page.screenshot(path=shot("review-queue.png"), full_page=True)
        await assert_accessible(page, "the review queue")

        # Keyboard: j moves to the first item, Enter opens it.
        await page.keyboard.press("j")
        await expect(row.locator(".item-link")).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(page.locator("#review-heading")).to_have_text("Review attempt 1")
        await expect(page.locator("#review-what")).to_contain_text("diff sha256")

        # A comment on line 2 of calc.py (the added line), then a request for changes, by name.
        await page.locator('.dv-add-comment[data-side="new"][data-line="2"]').click()
        await page.get_by_role("textbox", name="Your comment on calc.py line 2").fill(
            "Say what add() returns, in a docstring above this."
        )
        # A live refresh (the stream's events) redraws nothing under a comment being written.
        await page.locator("#review-comment").fill("Document")
        await page.evaluate("() => pageRefresh()")
        await expect(page.get_by_role("textbox", name="Your comment on calc.py line 2")).to_have_value(
            "Say what add() returns, in a docstring above this."
        )
        await expect(page.locator("#review-comment")).to_have_value("Document")
        await page.get_by_role("button", name="Add comment").click()
        await expect(page.locator(".dv-note.pending")).to_contain_text("in a docstring above this")
        await expect(page.locator("#pending-comments")).to_contain_text("1 line comment goes with your decision")
        await page.locator("#reviewer-name").fill("bob")
        await page.locator("#review-comment").fill("Document add().")
        await page.screenshot(path=shot("review-line-comment.png"), full_page=True)
        await assert_accessible(page, "an item awaiting review, with a line comment")
        await page.locator("#request-changes").click()

        # Attempt 2 comes in live: shown against attempt 1, bob's comment beside the line it was about.
        await expect(page.locator("#review-heading")).to_have_text("Review attempt 2", timeout=180_000)
        await expect(page.locator("#change-heading")).to_have_text("Change of attempt 2, against attempt 1")
        note = page.locator(".dv-note.review")
        await expect(note).to_contain_text("in a docstring above this")
        await expect(note).to_contain_text("bob (API key")
        await expect(page.locator(".dv-line.since-new").first).to_contain_text('"""The sum of a and b."""')
        await page.screenshot(path=shot("review-compare.png"), full_page=True)
        # What attempt 2's agent was given: the line comment with its file and line, quoted as reviewer input.
        trajectory = page.locator(".trajectory")
        await expect(trajectory).to_contain_text("Reviewer input on attempt 1 from bob")
        await expect(trajectory).to_contain_text("calc.py:2")
        await trajectory.screenshot(path=shot("review-next-attempt-input.png"))

        await page.locator("#compare-toggle").click()
        await expect(page.locator("#change-heading")).to_have_text("Change of attempt 2")
        await page.locator("#reviewer-name").fill("alice")
        await page.locator("#review-comment").fill("LGTM")
        await page.locator("#approve").click()
        await expect(page.locator("h1 [data-state]")).to_have_attribute("data-state", "succeeded", timeout=90_000)
        story = page.locator("#timeline")
        await expect(story).to_contain_text(f"bob (API key {stack.alpha.key_id}) requested changes to attempt 1")
        await expect(story).to_contain_text("Document add().")
        await expect(story).to_contain_text(f"alice (API key {stack.alpha.key_id}) approved attempt 2")
        await expect(story).to_contain_text("LGTM")
        await expect(page.locator("#events")).to_contain_text("review")
        await expect(page.locator("#events")).not_to_contain_text('"writer"')
        await page.locator("#timeline").scroll_into_view_if_needed()
        await page.screenshot(path=shot("review-timeline.png"), full_page=True)
        await assert_accessible(page, "a reviewed and landed item")


async def test_a_stale_approval_is_refused_and_a_rejection_needs_a_reason(stack: Stack, calc_repo: Path) -> None:
    from playwright.async_api import expect

    async with stack.client() as c:
        wid = (
            await c.post(
                "/v1/work-items",
                json=reviewed(calc_repo, {"files": {"calc.py": RIGHT}}, {"files": {"calc.py": DOCSTRING}}),
            )
        ).json()["id"]
        await awaiting(c, wid, 1)

    async with chromium_page(CHROMIUM) as page:
        # This console hears nothing live (its stream answers with no event), so it keeps showing attempt 1 as the
        # one awaiting review while another reviewer sends it back and attempt 2 comes in.
        async def quiet(route: Any) -> None:
            await route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body="retry: 60000\n\n")

        await page.route("**/events/stream*", quiet)
        await sign_in(page, stack.api.url, stack.alpha.key, f"/items/{wid}")
        await expect(page.locator("#review-heading")).to_have_text("Review attempt 1")
        await expect(page.locator("#approve")).to_be_enabled()
        async with stack.client() as c:
            r = await c.post(
                f"/v1/work-items/{wid}/review",
                json={"action": "request_changes", "attempt": 1, "comment": "Docstring, please."},
            )
            assert r.status_code == 200, r.text
            await awaiting(c, wid, 2)

        await page.locator("#approve").click()
        refused = page.locator("#review-refused")
        await expect(refused).to_contain_text("Not sent: you were looking at a stale change.")
        await expect(refused).to_contain_text("attempt 2 is the one awaiting review")
        await page.locator("#review-box").evaluate("e => e.scrollIntoView({block: 'end'})")
        await page.screenshot(path=shot("review-stale-refused.png"))
        await page.locator("#show-waiting").click()
        await expect(page.locator("#review-heading")).to_have_text("Review attempt 2")
        await expect(page.locator('.timeline button[data-n="2"]')).to_have_attribute("aria-pressed", "true")

        # Reject asks first, and wants a reason.
        await page.locator("#reject").click()
        dialog = page.locator("#reject-dialog")
        await expect(dialog).to_be_visible()
        await page.locator("#confirm-reject").click()
        await expect(dialog).to_contain_text("A rejection needs a reason")
        await page.screenshot(path=shot("review-reject-dialog.png"))
        await assert_accessible(page, "the reject dialog")
        await page.locator("#reject-reason").fill("Docstrings belong in a separate change.")
        await page.locator("#confirm-reject").click()
        await expect(dialog).to_have_count(0)
    async with stack.client() as c:
        done = await wait_state(c, wid, {"rejected"}, timeout_s=60)
    assert (
        done["reason"] == f"rejected by reviewer API key {stack.alpha.key_id}: Docstrings belong in a separate change."
    )


def big_module(lines: int) -> str:
    return "".join(f"def f{n}(x):\n    return x + {n}\n\n" for n in range(lines // 3))


async def test_a_300_line_diff_a_narrow_window_and_the_api_lost_and_back(stack: Stack, calc_repo: Path) -> None:
    from playwright.async_api import expect

    change = {"files": {"calc.py": RIGHT, "helpers.py": big_module(300)}}
    async with stack.client() as c:
        wid = (
            await c.post("/v1/work-items", json=reviewed(calc_repo, change, instruction="Fix add() and add helpers"))
        ).json()["id"]
        await awaiting(c, wid, 1)
        model = (await c.get(f"/v1/work-items/{wid}/diff", params={"format": "json"})).json()
    assert model["additions"] >= 300

    async with chromium_page(CHROMIUM) as page:
        await sign_in(page, stack.api.url, stack.alpha.key, f"/items/{wid}")
        files = page.get_by_role("navigation", name="Files changed in attempt 1")
        await expect(files.locator("li")).to_have_count(2)
        await expect(files).to_contain_text("helpers.py")
        helpers = page.locator('details.dv-file[data-path="helpers.py"]')
        added = next(f["additions"] for f in model["files"] if f["path"] == "helpers.py")
        await expect(helpers.locator("tr.dv-line.add")).to_have_count(added)
        # Line numbers, and the file folds away.
        await expect(helpers.locator("tr.dv-line.add").last.locator("td.dv-num").nth(1)).not_to_be_empty()
        await helpers.locator("summary").click()
        await expect(helpers.locator("table")).to_be_hidden()
        await helpers.locator("summary").click()
        # The review box follows the end of the diff.
        end = await page.locator("#diff").bounding_box()
        box = await page.locator("#review-box").bounding_box()
        assert end and box and 0 <= box["y"] - (end["y"] + end["height"]) < 200, (end, box)
        await page.screenshot(path=shot("review-300-line-diff-full.png"), full_page=True)
        # The top of the change (file list, counts, line numbers) and its end, where the review box follows.
        await page.locator("#change-heading").evaluate("e => e.scrollIntoView({block: 'start'})")
        await page.screenshot(path=shot("review-300-line-diff.png"))
        await page.locator("#review-box").evaluate("e => e.scrollIntoView({block: 'end'})")
        await page.screenshot(path=shot("review-300-line-diff-end.png"))

        # A phone-sized window: nothing wider than the window but the diff's own scroll area.
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.reload()
        await expect(page.locator("#review-heading")).to_have_text("Review attempt 1")
        assert await page.evaluate("() => document.documentElement.scrollWidth") <= 391
        await page.screenshot(path=shot("review-narrow-390.png"))
        await assert_accessible(page, "an item at 390 px")
        await page.goto(f"{stack.api.url}/console#/")
        await expect(page.locator(f'tr[data-id="{wid}"]')).to_be_visible()
        assert await page.evaluate("() => document.documentElement.scrollWidth") <= 391
        await page.screenshot(path=shot("review-queue-narrow-390.png"), full_page=True)
        await assert_accessible(page, "the queue at 390 px")

        # The API goes away under the open console: it says so, keeps retrying, and comes back by itself.
        await page.set_viewport_size({"width": 1366, "height": 900})
        await page.goto(f"{stack.api.url}/console#/items/{wid}")
        await expect(page.locator("#review-heading")).to_have_text("Review attempt 1")
        await expect(page.locator("#live-status")).to_have_text("● live", timeout=15_000)
        await asyncio.to_thread(stack.api.stop)
        banner = page.locator("#conn")
        await expect(banner).to_contain_text("Cannot reach the crewwork API", timeout=30_000)
        await page.locator("#approve").click()
        await expect(page.locator("#review-refused")).to_contain_text("Not sent: the API cannot be reached.")
        await page.screenshot(path=shot("console-connection-lost.png"), full_page=False)
        await asyncio.to_thread(stack.api.start)
        await expect(banner).to_contain_text("Connected to the crewwork API again", timeout=60_000)
        await expect(page.locator("#live-status")).to_have_text("● live", timeout=30_000)
        await expect(page.locator("#review-heading")).to_have_text("Review attempt 1")

        # A model agent's transcript reads as its turns and the edits it proposed, not as JSON.
        transcript = {
            "agent": "model",
            "tokens_used": 1234,
            "cost_usd": 0.01,
            "messages": [
                {"role": "system", "content": "You edit code."},
                {"role": "user", "content": "# Task\nFix add()"},
                {
                    "role": "assistant",
                    "content": "calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE",
                },
            ],
            "calls": [{"model": "test-model", "usage": {"total_tokens": 1234}}],
        }
        drawn = await page.evaluate(
            "t => { const el = CrewTrajectory.render(JSON.stringify(t)); document.body.append(el); return el.innerText; }",
            transcript,
        )
        assert "Model turn 1" in drawn and "1 edit(s)" in drawn and "edit calc.py" in drawn and "1234 tokens" in drawn

    if os.environ.get("CREWWORK_UPDATE_DOC_IMAGES"):
        images = Path(__file__).resolve().parents[2] / "docs" / "images"
        for name in DOC_IMAGES:
            if (ARTIFACTS / name).exists():
                shutil.copy(ARTIFACTS / name, images / name)
