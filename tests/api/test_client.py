"""crewwork.client against the real API: the async client submits, follows the SSE stream to the end, reads
events, evidence and artifacts, reviews; a webhook delivery verifies with `verify_webhook`; and importing the client
loads neither Temporal's SDK nor SQLAlchemy."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from crewwork.client import ApiError, AsyncClient, Client, WaitTimeout, WebhookVerificationError, verify_webhook
from crewwork.config import Settings
from crewwork.temporal.devserver import free_port
from tests.api.conftest import Stack, task_item
from tests.api.test_api_webhooks import Receiver
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    # The receivers here listen on loopback, which a webhook may reach only where the operator allows it.
    return api_settings.model_copy(update={"outbound_allow_networks": "127.0.0.0/8"})


def test_the_client_imports_neither_temporalio_nor_sqlalchemy() -> None:
    code = (
        "import sys\n"
        "import crewwork.client\n"
        "from crewwork.client import Client, AsyncClient, verify_webhook\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('temporalio', 'sqlalchemy'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, f"importing crewwork.client loaded {res.stdout.strip()} {res.stderr[-500:]}"


async def test_async_client_follows_a_code_change_through_review_to_the_end(stack: Stack, calc_repo: Path) -> None:
    async with AsyncClient(stack.api.url, stack.alpha.key) as c:
        sub = await c.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True}))
        wid = sub["id"]
        seen: list[str] = []
        item = await c.wait(
            wid,
            until=["awaiting_review"],
            timeout_s=120,
            on_event=lambda e: seen.append(e["data"].get("state", "")) if e["type"] == "state_changed" else None,
        )
        assert item["state"] == "awaiting_review" and "validating" in seen
        assert "+    return a + b" in await c.diff(wid)
        evidence = await c.evidence(wid)
        assert evidence[-1]["verdict"] == "passed"
        arts = await c.artifacts(wid)
        diff_art = next(a for a in arts if a["content_type"].startswith("text/x-diff") or "diff" in a["name"])
        assert b"return a + b" in await c.artifact(wid, diff_art["id"])
        assert (await c.review(wid, "approve", comment="ok"))["message"].startswith("review recorded")
        done = await c.wait(wid, timeout_s=120)
        assert done["state"] == "succeeded" and done["delivery_branch"] == f"crewwork/{wid}"
        # The stream resumes after an event id: nothing before it comes again.
        events = await c.events(wid)
        middle = events[len(events) // 2]["id"]
        resumed = []
        async for ev in c.stream_events(wid, after=middle):
            resumed.append(ev["id"])
            if ev["id"] == events[-1]["id"]:
                break
        assert resumed == [e["id"] for e in events if e["id"] > middle]
        page = await c.list(limit=5)
        assert any(it["id"] == wid for it in page["items"])
        with pytest.raises(ApiError) as err:
            await c.review(wid, "approve")
        assert err.value.status == 409 and err.value.code == "review_not_allowed"
        with pytest.raises(ApiError) as err:
            await c.get("wi_nope")
        assert err.value.status == 404 and err.value.code == "not_found"


async def test_sync_client_waits_with_a_timeout_and_webhooks_verify(stack: Stack) -> None:
    receiver = Receiver(free_port())
    receiver.start()
    try:

        def sync_part() -> tuple[str, str, str]:
            with Client(stack.api.url, stack.alpha.key) as c:
                hook = c.create_webhook(f"http://127.0.0.1:{receiver.port}/hook")
                # An agent that takes 30 s: a 3 s wait times out and says where the item is.
                item = task_item()
                item["agent"]["config"]["delay_s"] = 30
                wid = c.submit(item)["id"]
                with pytest.raises(WaitTimeout) as err:
                    c.wait(wid, timeout_s=3)
                assert err.value.state in ("admitted", "running")
                c.cancel(wid)
                assert c.wait(wid, timeout_s=60)["state"] == "cancelled"
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not any(
                    json.loads(b).get("state") == "cancelled" for _h, b in list(receiver.received)
                ):
                    time.sleep(0.1)
                rotated = c.rotate_webhook_secret(hook["id"], overlap_s=60)
                return wid, hook["secret"], rotated["secret"]

        wid, old, new = await asyncio.to_thread(sync_part)
        headers, body = next((h, b) for h, b in receiver.received if json.loads(b).get("state") == "cancelled")
        assert verify_webhook(old, headers, body)["work_item_id"] == wid
        with pytest.raises(WebhookVerificationError):
            verify_webhook(new, headers, body)  # delivered before the rotation: signed with the old secret only
        with pytest.raises(WebhookVerificationError):
            verify_webhook(old, {**headers, "webhook-timestamp": str(int(time.time()) - 3600)}, body)
        with pytest.raises(WebhookVerificationError):
            verify_webhook(old, headers, body.replace(b"cancelled", b"succeeded"))
    finally:
        receiver.stop()


async def test_wait_survives_an_api_restart_without_losing_or_repeating_events(stack: Stack) -> None:
    item = task_item()
    item["agent"]["config"]["delay_s"] = 4
    async with AsyncClient(stack.api.url, stack.alpha.key) as c:
        wid = (await c.submit(item))["id"]
        seen: list[int] = []

        async def restart_soon() -> None:
            while not seen:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(stack.api.restart)

        restarter = asyncio.create_task(restart_soon())
        done = await c.wait(wid, timeout_s=120, on_event=lambda e: seen.append(e["id"]))
        await restarter
        assert done["state"] == "succeeded"
        assert seen == sorted(set(seen)), "no event twice, in order"
        assert seen == [e["id"] for e in await c.events(wid)], "every event, across the reconnect"
