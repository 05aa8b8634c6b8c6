"""The same API on the embedded SQLite store (the `crewwork dev` default): submit, label filters, the live event
stream and the webhook outbox behave as on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select

from crewwork.store.tables import OutboxMessage
from crewwork.temporal.devserver import DevServer
from tests.api.conftest import LiveApi, Stack, make_tenant, task_item, wait_state
from tests.api.test_api_sse import finished, sse_events, take
from tests.conftest import make_settings, running_crew

pytestmark = [pytest.mark.temporal]


@pytest.fixture
async def sqlite_stack(tmp_path: Path, temporal_server: DevServer, sqlite_url: str) -> AsyncIterator[Stack]:
    settings = make_settings(tmp_path, temporal_server, sqlite_url, outbound_allow_networks="127.0.0.0/8")
    async with running_crew(settings, pools=("control", "agent")) as crew:
        alpha = await make_tenant(crew, "alpha")
        beta = await make_tenant(crew, "beta")
        admin = await make_tenant(crew, "ops", ("admin",))
        api = LiveApi(settings).start()
        try:
            yield Stack(crew, api, alpha, beta, admin)
        finally:
            api.stop()


async def test_submit_filter_stream_and_outbox_on_sqlite(sqlite_stack: Stack) -> None:
    stack = sqlite_stack
    async with stack.client() as c:
        hook = (await c.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/never"})).json()
        wid = (await c.post("/v1/work-items", json=task_item(labels={"env": "dev"}))).json()["id"]
        await wait_state(c, wid, {"succeeded"})
        assert [i["id"] for i in (await c.get("/v1/work-items", params={"label": "env=dev"})).json()["items"]] == [wid]
        assert (await c.get("/v1/work-items", params={"label": "env=prod"})).json()["items"] == []
        events = await take(sse_events(c, f"/v1/work-items/{wid}/events/stream"), finished)
        log = (await c.get(f"/v1/work-items/{wid}/events")).json()
        assert [int(e["id"]) for e in events] == [e["id"] for e in log][: len(events)]
    for _ in range(100):
        async with stack.crew.store.session() as s:
            rows = (await s.scalars(select(OutboxMessage).where(OutboxMessage.webhook_id == hook["id"]))).all()
        if rows and all(r.attempts >= 1 for r in rows):
            break
        await asyncio.sleep(0.2)
    assert rows and {r.work_item_id for r in rows} == {wid}
    assert all(r.status == "pending" and r.attempts >= 1 for r in rows), "retried, not dropped"
