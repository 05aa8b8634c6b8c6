"""Webhooks through the durable outbox: a receiver that is down for a while still gets every state change, signed,
once its server is up; failures past the limit land in the dead-letter state and can be redelivered."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from crewwork.store.tables import Event, OutboxMessage
from crewwork.temporal.devserver import free_port
from crewwork.webhooks.signing import DELIVERY_HEADER, SIGNATURE_HEADER, verify
from tests.api.conftest import LiveApi, Stack, task_item, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    # The receivers here listen on loopback, which a webhook may reach only where the operator allows it.
    return api_settings.model_copy(update={"outbound_allow_networks": "127.0.0.0/8"})


class Receiver:
    """A real HTTP server on 127.0.0.1 that records what it is sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.received: list[tuple[dict[str, str], bytes]] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


async def outbox_rows(stack: Stack, hook_id: str) -> list[OutboxMessage]:
    async with stack.crew.store.session() as s:
        return list((await s.scalars(select(OutboxMessage).where(OutboxMessage.webhook_id == hook_id))).all())


async def test_receiver_down_then_up_gets_every_state_change_signed_and_none_lost(stack: Stack) -> None:
    receiver = Receiver(free_port())
    async with stack.client() as c:
        hook = (await c.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{receiver.port}/hook"})).json()
        assert hook["secret"].startswith("whsec_")
        ids = [(await c.post("/v1/work-items", json=task_item({"n": n}))).json()["id"] for n in range(3)]
        for wid in ids:
            await wait_state(c, wid, {"succeeded"})

        # While the receiver is down, deliveries fail and are retried, never dropped.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = await outbox_rows(stack, hook["id"])
            if rows and all(r.attempts >= 1 for r in rows):
                break
            await asyncio.sleep(0.2)
        assert rows and all(r.status == "pending" and r.attempts >= 1 for r in rows)
        assert all("Connect" in (r.last_error or "") for r in rows)

        receiver.start()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                rows = await outbox_rows(stack, hook["id"])
                if all(r.status == "delivered" for r in rows):
                    break
                await asyncio.sleep(0.2)
            assert all(r.status == "delivered" for r in rows), [(r.status, r.attempts) for r in rows]
            deliveries = (await c.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()
            assert {d["status"] for d in deliveries} == {"delivered"}
        finally:
            receiver.stop()

    # Every state change of every item, each signed with the webhook's secret.
    async with stack.crew.store.session() as s:
        changes = (
            await s.execute(
                select(Event.work_item_id, Event.data).where(Event.work_item_id.in_(ids), Event.type == "state_changed")
            )
        ).all()
    expected = sorted((wid, data["state"]) for wid, data in changes)
    got = []
    delivery_ids = set()
    for headers, body in receiver.received:
        assert verify(hook["secret"], headers[SIGNATURE_HEADER.lower()], body)
        assert not verify("whsec_wrong", headers[SIGNATURE_HEADER.lower()], body)
        payload = json.loads(body)
        # Which item it is about, at a glance: a mock agent's results are labelled so here too.
        assert (payload["kind"], payload["mock"]) == ("task", True), payload
        delivery_ids.add(headers[DELIVERY_HEADER.lower()])
        got.append((payload["work_item_id"], payload["state"]))
    assert len(delivery_ids) == len(rows), "each outbox row arrives (at least once; ids let receivers dedupe)"
    assert sorted(set(got)) == sorted(set(expected)) and len(expected) >= 3 * 3


async def test_failing_deliveries_go_dead_letter_and_can_be_redelivered(stack: Stack) -> None:
    api = LiveApi(
        stack.api.settings,
        ApiOptions(api_rate_per_s=1000, webhook_max_attempts=2, webhook_backoff_s=0.1, webhook_max_backoff_s=0.2),
    ).start()
    stack.api.stop()  # only the deliverer configured here runs
    receiver = Receiver(free_port())
    try:
        import httpx

        async with httpx.AsyncClient(base_url=api.url, headers=stack.alpha.headers, timeout=30) as c:
            hook = (await c.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{receiver.port}/x"})).json()
            wid = (await c.post("/v1/work-items", json=task_item())).json()["id"]
            await wait_state(c, wid, {"succeeded"})
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                rows = await outbox_rows(stack, hook["id"])
                if rows and all(r.status == "dead" for r in rows):
                    break
                await asyncio.sleep(0.2)
            assert rows and all(r.status == "dead" and r.attempts == 2 for r in rows)

            receiver.start()
            requeued = (await c.post(f"/v1/webhooks/{hook['id']}/redeliver")).json()["requeued"]
            assert requeued == len(rows)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                rows = await outbox_rows(stack, hook["id"])
                if all(r.status == "delivered" for r in rows):
                    break
                await asyncio.sleep(0.2)
            assert all(r.status == "delivered" for r in rows)
            assert len(receiver.received) == len(rows)
    finally:
        receiver.stop()
        api.stop()
        stack.api.start()
