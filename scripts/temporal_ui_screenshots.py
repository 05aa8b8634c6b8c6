"""Screenshots of Temporal's Web UI with running crewwork work items, for docs/images/ (docs/operations.md).

Starts the embedded stack (Temporal dev server with its UI, SQLite, API, pools), submits a `task` whose agent takes
a while and a code change that waits for review, then drives Debian's Chromium (never `playwright install`) to the
workflow list (with the `CrewworkState` column, as a user adds it in the list's column settings) and to the running
item's page, where the workflow summary and details crewwork sets at start show.

    .venv/bin/python scripts/temporal_ui_screenshots.py [--out docs/images]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crewwork.cli.demo import RIGHT, demo_work_item, make_sample_repo
from crewwork.cli.stack import Stack
from crewwork.temporal.devserver import free_port

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


async def shoot(ui: str, workflow_id: str, out: Path) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = await browser.new_page(viewport={"width": 1440, "height": 900})
        # The list's columns with crewwork's state, as the UI stores them once a user adds the column.
        columns = [
            {"label": label, "pinned": label in ("Status", "Workflow ID")}
            for label in ("Status", "Workflow ID", "CrewworkState", "Type", "Start", "End")
        ]
        await page.add_init_script(
            f"localStorage.setItem('namespace-workflow-table-columns', {json.dumps(json.dumps({'default': columns}))})"
        )
        for _ in range(3):  # the UI's first load can fail while its server warms up: reload
            await page.goto(f"{ui}/namespaces/default/workflows", wait_until="load")
            try:
                await page.locator("table tr", has_text=workflow_id).wait_for(timeout=20_000)
                break
            except Exception:
                continue
        await page.wait_for_timeout(1000)
        await page.screenshot(path=str(out / "temporal-ui-workflows.png"))
        await page.goto(f"{ui}/namespaces/default/workflows/{workflow_id}", wait_until="load")
        await page.wait_for_timeout(4000)
        await page.screenshot(path=str(out / "temporal-ui-running-item.png"))
        # The summary and details crewwork sets at start (start_workflow(static_summary=, static_details=)).
        await page.get_by_text("User Metadata", exact=True).first.click()
        await page.wait_for_timeout(1500)
        await page.screenshot(path=str(out / "temporal-ui-summary.png"))
        await browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/images")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crewwork-shots-") as tmp:
        data = Path(tmp)
        repo = data / "sample-repo"
        make_sample_repo(repo)
        stack = Stack(
            data_dir=data / "state",
            temporal_port=free_port(),
            ui_port=free_port(),
            api_port=free_port(),
            extra_env={"CREWWORK_SANDBOX_BACKEND": "bwrap"},
            database_url=f"sqlite+aiosqlite:///{data / 'state' / 'crewwork.db'}",
        )
        stack.start()
        try:
            api = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=30)
            review = demo_work_item(repo, "bwrap")
            review["agent"]["config"] = {"files": {"calc.py": RIGHT}}
            review["idempotency_key"] = "shots-review"
            r1 = api.post("/v1/work-items", json=review).json()
            slow = {
                "kind": "task",
                "instruction": "Summarise the failing tests of last night's build\nand propose owners for each.",
                "input": {"build": 1234},
                "agent": {"name": "scripted", "config": {"output": {"ok": True}, "delay_s": 300}},
                "labels": {"source": "screenshots"},
            }
            r2 = api.post("/v1/work-items", json=slow).json()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                states = {api.get(f"/v1/work-items/{r['id']}").json()["state"] for r in (r1, r2)}
                if states == {"awaiting_review", "running"}:
                    break
                time.sleep(0.5)
            asyncio.run(shoot(stack.ui_url, r2["workflow_id"], out))
            print(f"wrote {out / 'temporal-ui-workflows.png'} and {out / 'temporal-ui-running-item.png'}")
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
