"""Retention end to end: real code changes through the HTTP API, a legal hold set and audited through it, the
retention workflow run on the control pool, and what the API answers afterwards (a removed artifact is a 410, the
item's record and the digests of what was removed stay). And the Temporal Schedule the control pools keep."""

from __future__ import annotations

import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.config.operations import RetentionSettings
from crewwork.temporal.devserver import DevServer
from crewwork.workers.schedules import ensure_retention_schedule, retention_schedule_id
from crewwork.workflows.reaper import RetentionRunInput, RetentionRunResult, RetentionWorkflow
from tests.api.conftest import LiveApi, make_tenant, wait_state
from tests.conftest import make_settings, running_crew
from tests.integration.test_lifecycle import VALIDATION, code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def test_retention_removes_expired_details_keeps_held_items_whole_and_the_api_says_so(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    settings = make_settings(
        tmp_path,
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        retention=RetentionSettings(days=30, compact_after_s=0),
    )
    # Enough tests, run verbosely, that each validation log and report is worth storing by content (2 KiB or more).
    (calc_repo / "tests" / "test_many.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('n', range(80))\ndef test_case(n):\n    assert n >= 0\n"
    )
    subprocess.run(["git", "add", "-A"], cwd=calc_repo, check=True, capture_output=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "more tests"],
        cwd=calc_repo,
        check=True,
        capture_output=True,
    )
    async with running_crew(settings) as crew:
        api = LiveApi(settings).start()
        try:
            alice = await make_tenant(crew, "alice")
            bob = await make_tenant(crew, "bob")
            item = code_change(
                calc_repo,
                [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}],
                review={"required": False},
                validation={**VALIDATION, "command": [*VALIDATION["command"], "-v"]},
            )
            async with httpx.AsyncClient(base_url=api.url, headers=alice.headers, timeout=30) as c:
                held, expired = [(await c.post("/v1/work-items", json=item)).json()["id"] for _ in range(2)]
                for wid in (held, expired):
                    assert (await wait_state(c, wid, {"succeeded", "failed"}, 60))["state"] == "succeeded"
                r = await c.put(f"/v1/work-items/{held}/legal-hold", json={"reason": "audit 2027-01"})
                assert r.status_code == 200 and r.json()["legal_hold"]["reason"] == "audit 2027-01", r.text
                async with httpx.AsyncClient(base_url=api.url, headers=bob.headers, timeout=30) as other:
                    assert (
                        await other.put(f"/v1/work-items/{held}/legal-hold", json={"reason": "x"})
                    ).status_code == 404
                    assert (await other.delete(f"/v1/work-items/{expired}/legal-hold")).status_code == 404
                log_url = next(
                    a["url"]
                    for a in (await c.get(f"/v1/work-items/{expired}/artifacts")).json()
                    if a["name"].endswith(".log") or "log" in a["name"]
                )
                before = {wid: (await c.get(f"/v1/work-items/{wid}/artifacts")).json() for wid in (held, expired)}

                # Both ended 40 days ago (as far as the store knows).
                async with crew.store.session() as s:
                    await s.execute(
                        text("UPDATE work_items SET updated_at = updated_at - 40 * 86400 WHERE id IN (:a, :b)"),
                        {"a": held, "b": expired},
                    )
                run = await crew.client.execute_workflow(
                    RetentionWorkflow.run,
                    RetentionRunInput(batch=50, max_batches=20),
                    id=f"retention-test-{uuid.uuid4().hex[:6]}",
                    task_queue=settings.task_queue("control"),
                    result_type=RetentionRunResult,
                )
                assert run.retained >= 1 and run.compacted >= 1, run

                gone = (await c.get(f"/v1/work-items/{expired}")).json()
                assert gone["state"] == "succeeded" and gone["retained_at"] is not None
                assert gone["result"]["reason"].startswith("validated on attempt 2")
                after = (await c.get(f"/v1/work-items/{expired}/artifacts")).json()
                assert [(a["id"], a["sha256"], a["size"]) for a in after] == [
                    (a["id"], a["sha256"], a["size"]) for a in before[expired]
                ]
                assert all(a["removed_at"] is not None for a in after if not a["name"].endswith("evidence-bundle.json"))
                r = await c.get(log_url)
                assert r.status_code == 410 and r.json()["code"] == "artifact_removed"
                r = await c.get(f"/v1/work-items/{expired}/diff")
                assert r.status_code == 410
                evidence = (await c.get(f"/v1/work-items/{expired}/evidence")).json()
                assert [e["verdict"] for e in evidence] == ["failed", "passed"]  # verdicts and causes stay
                assert {e["type"] for e in (await c.get(f"/v1/work-items/{expired}/events")).json()} >= {
                    "submitted",
                    "retention_applied",
                }

                kept = (await c.get(f"/v1/work-items/{held}")).json()
                assert kept["retained_at"] is None and kept["legal_hold"]["reason"] == "audit 2027-01"
                for a in (await c.get(f"/v1/work-items/{held}/artifacts")).json():
                    assert a["removed_at"] is None
                    body = await c.get(a["url"])
                    assert body.status_code == 200 and len(body.content) == a["size"]  # compacted, read back whole
                assert (await c.get(f"/v1/work-items/{held}/diff")).status_code == 200

                # Clearing the hold lets the next run remove its details; both acts are in its log.
                cleared = await c.delete(f"/v1/work-items/{held}/legal-hold")
                assert cleared.status_code == 200 and cleared.json()["legal_hold"] is None
                await crew.client.execute_workflow(
                    RetentionWorkflow.run,
                    RetentionRunInput(batch=50),
                    id=f"retention-test-{uuid.uuid4().hex[:6]}",
                    task_queue=settings.task_queue("control"),
                    result_type=RetentionRunResult,
                )
                events: list[dict[str, Any]] = (await c.get(f"/v1/work-items/{held}/events")).json()
                kinds = [e["type"] for e in events]
                assert kinds.count("legal_hold_set") == 1 and kinds.count("legal_hold_cleared") == 1
                assert "retention_applied" in kinds
                setter = next(e for e in events if e["type"] == "legal_hold_set")
                assert setter["data"]["set_by"] == alice.key_id
        finally:
            api.stop()


async def test_the_control_pools_keep_one_retention_schedule_as_the_settings_say(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    from crewwork.temporal.client import connect

    settings = make_settings(tmp_path, temporal_server, pg_url, retention=RetentionSettings(interval_s=600))
    client = await connect(settings)
    handle = client.get_schedule_handle(retention_schedule_id(settings))
    # Two control pools starting at once, then one with another interval, then one that turns it off.
    await ensure_retention_schedule(client, settings)
    await ensure_retention_schedule(client, settings)
    spec = (await handle.describe()).schedule.spec
    assert [i.every for i in spec.intervals] == [timedelta(seconds=600)]
    other = settings.model_copy(update={"retention": RetentionSettings(interval_s=120, batch=7)})
    await ensure_retention_schedule(client, other)
    desc = await handle.describe()
    assert [i.every for i in desc.schedule.spec.intervals] == [timedelta(seconds=120)]
    off = settings.model_copy(update={"retention": RetentionSettings(interval_s=0)})
    await ensure_retention_schedule(client, off)
    with pytest.raises(Exception, match=r"not found|NotFound|not_found"):
        await handle.describe()
