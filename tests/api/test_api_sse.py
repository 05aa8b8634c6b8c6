"""Live events over Server-Sent Events: exact resume with Last-Event-ID across an API restart, the tenant-wide
stream, and no event skipped when transactions commit out of id order (PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from crewwork.api.streams import CLOSE_COMMENT
from crewwork.store.tables import Event
from tests.api.conftest import Stack, task_item, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def sse_events(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Parse a text/event-stream into {id, event, data} dicts (comments and retry lines skipped)."""
    async with client.stream("GET", path, headers={"Accept": "text/event-stream", **(headers or {})}) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        cur: dict[str, Any] = {}
        async for line in r.aiter_lines():
            if line == "":
                if "data" in cur:
                    yield cur
                cur = {}
            elif line.startswith(":") or line.startswith("retry:"):
                continue
            else:
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                cur[field] = json.loads(value) if field == "data" else value


async def take(agen: AsyncIterator[dict[str, Any]], until: Any, timeout_s: float = 60) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    async def run() -> None:
        async for ev in agen:
            out.append(ev)
            if until(out):
                return

    await asyncio.wait_for(run(), timeout_s)
    return out


def finished(evs: list[dict[str, Any]]) -> bool:
    return any(e["event"] == "state_changed" and e["data"]["data"]["state"] == "succeeded" for e in evs)


async def test_reconnect_with_last_event_id_after_api_restart_yields_every_event_once_in_order(stack: Stack) -> None:
    async with stack.client() as c:
        # A slow task, so that the restart happens while the work item is still producing events.
        wid = (
            await c.post(
                "/v1/work-items",
                json=task_item(
                    {"ok": True}, agent={"name": "scripted", "config": {"output": {"ok": True}, "delay_s": 2.0}}
                ),
            )
        ).json()["id"]
        first = await take(sse_events(c, f"/v1/work-items/{wid}/events/stream"), lambda evs: len(evs) >= 2)
    last_id = first[-1]["id"]

    stack.api.restart()

    async with stack.client() as c:
        rest = await take(sse_events(c, f"/v1/work-items/{wid}/events/stream", {"Last-Event-ID": last_id}), finished)
        log = (await c.get(f"/v1/work-items/{wid}/events")).json()

    seen = [int(e["id"]) for e in first + rest]
    assert seen == sorted(set(seen)), "no duplicates, in order"
    assert seen == [e["id"] for e in log if e["id"] <= seen[-1]], "exactly the event log, nothing lost"
    assert [e["event"] for e in first + rest] == [e["type"] for e in log if e["id"] <= seen[-1]]
    assert all(e["data"]["work_item_id"] == wid for e in first + rest)


async def test_events_endpoint_negotiates_sse_and_tenant_stream_sees_only_own_items(stack: Stack) -> None:
    async with stack.client(stack.alpha) as alpha, stack.client(stack.beta) as beta:
        before = (await alpha.get("/v1/work-items")).json()
        mine = (await alpha.post("/v1/work-items", json=task_item())).json()["id"]
        theirs = (await beta.post("/v1/work-items", json=task_item())).json()["id"]
        await wait_state(alpha, mine, {"succeeded"})
        await wait_state(beta, theirs, {"succeeded"})

        via_accept = await take(sse_events(alpha, f"/v1/work-items/{mine}/events"), finished)
        assert next(e["data"]["type"] for e in via_accept) == "submitted"

        tenant = await take(sse_events(alpha, "/v1/events/stream?after=0"), finished)
        ids = {e["data"]["work_item_id"] for e in tenant}
        assert mine in ids and theirs not in ids
        assert before is not None


async def test_stream_waits_for_an_earlier_id_that_commits_late(stack: Stack) -> None:
    """Ids are taken at insert but transactions commit in any order: a stream must not pass over an id whose
    transaction is still open, or a client resuming from the later id would lose it."""
    store = stack.crew.store
    tid = await store.ensure_tenant(stack.alpha.name)
    async with stack.client() as c:
        wid = (await c.post("/v1/work-items", json=task_item())).json()["id"]
        await wait_state(c, wid, {"succeeded"})
        done = await take(sse_events(c, f"/v1/work-items/{wid}/events/stream"), finished)
        resume_after = done[-1]["id"]

        async with store.session() as slow:
            early = Event(work_item_id=wid, tenant_id=tid, type="probe_early", data={}, created_at=0.0)
            slow.add(early)
            await slow.flush()  # the id is taken, the transaction stays open
            await store.append_event(wid, tid, "probe_late", {})  # a larger id, committed first

            stream = sse_events(c, f"/v1/work-items/{wid}/events/stream", {"Last-Event-ID": resume_after})
            reader = asyncio.create_task(take(stream, lambda evs: len(evs) >= 2, timeout_s=30))
            await asyncio.sleep(1.5)
            assert not reader.done(), "the later id must not be streamed while the earlier one may still commit"
        got = await reader  # the slow transaction has committed now
    assert [e["event"] for e in got] == ["probe_early", "probe_late"]
    assert int(got[0]["id"]) < int(got[1]["id"])


async def test_stopping_the_api_ends_open_streams_with_a_resumable_close(stack: Stack) -> None:
    """An open console holds a live stream: stopping the API ends it at once with a resumable close (a `retry:` hint
    and a comment naming the last event id sent; uvicorn otherwise waited on the stream until its graceful-shutdown
    timeout, or forever without one), and a client that reconnects with that id after the restart misses nothing."""
    async with stack.client() as c:
        wid = (await c.post("/v1/work-items", json=task_item({"ok": True}))).json()["id"]
        await wait_state(c, wid, {"succeeded"})
        count = len((await c.get(f"/v1/work-items/{wid}/events")).json())
        lines: list[str] = []
        ids: list[int] = []
        stopping: asyncio.Future[None] | None = None

        async def read() -> None:
            nonlocal stopping
            path = f"/v1/work-items/{wid}/events/stream"
            async with c.stream("GET", path, headers={"Accept": "text/event-stream"}) as r:
                async for line in r.aiter_lines():
                    lines.append(line)
                    if line.startswith("id:"):
                        ids.append(int(line[3:]))
                    if len(ids) == count and stopping is None:
                        # Caught up with the log, the stream idles: stop the API under it.
                        stopping = asyncio.ensure_future(asyncio.to_thread(stack.api.stop))

        await asyncio.wait_for(read(), 60)
        assert stopping is not None
        await stopping
    closing = [ln for ln in lines if ln.startswith(": close")]
    assert closing == [f"{CLOSE_COMMENT} {ids[-1]}"], lines[-4:]
    assert lines[lines.index(closing[0]) - 1] == "retry: 1000"

    stack.api.start()
    async with stack.client() as c:
        log = (await c.get(f"/v1/work-items/{wid}/events")).json()
    assert ids == [e["id"] for e in log]
