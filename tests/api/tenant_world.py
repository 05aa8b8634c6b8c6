"""Two tenants' worth of resources on the real API, for the cross-tenant sweep and the response scans: tenant A owns
a reviewed code change (attempts, artifacts, a diff, a rejected stale write in its event log), a task submitted
with an idempotency key and a webhook; tenant B owns a task and a webhook of its own."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from crewwork.cli.demo import RIGHT
from crewwork.store.fencing import FencedWrite, Rank
from tests.api.conftest import Stack, task_item, wait_state

SHARED_IDEMPOTENCY_KEY = "shared-key-1"

VALIDATION = {
    "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
    "test_files": ["tests/test_calc.py"],
}


@dataclass
class Owned:
    tenant_id: str
    work_items: list[str] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    webhooks: list[str] = field(default_factory=list)
    repositories: list[str] = field(default_factory=list)
    workflows: list[str] = field(default_factory=list)
    page_cursor: str | None = None
    event_ids: list[int] = field(default_factory=list)

    def names(self) -> list[str]:
        """Every string that identifies one of this tenant's resources (none may appear in another's responses)."""
        return [self.tenant_id, *self.work_items, *self.artifacts, *self.webhooks, *self.repositories, *self.workflows]


@dataclass
class World:
    a: Owned
    b: Owned
    code_change: str
    """A's reviewed code change (awaiting review), with artifacts and a rejected stale write."""


async def _me(c: httpx.AsyncClient) -> str:
    return str((await c.get("/v1/me")).json()["tenant_id"])


async def build_world(stack: Stack, calc_repo: Path) -> World:
    async with stack.client(stack.alpha) as alpha, stack.client(stack.beta) as beta:
        a, b = Owned(await _me(alpha)), Owned(await _me(beta))
        spec = {
            "kind": "code_change",
            "repo": {"url": str(calc_repo), "ref": "main"},
            "instruction": "Fix add()",
            "validation": VALIDATION,
            "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": RIGHT}}]}},
            "review": {"required": True},
        }
        r = await alpha.post("/v1/work-items", json=spec)
        assert r.status_code == 202, r.text
        cc = r.json()["id"]
        r = await alpha.post(
            "/v1/work-items", json=task_item({"answer": 1}), headers={"Idempotency-Key": SHARED_IDEMPOTENCY_KEY}
        )
        assert r.status_code == 202, r.text
        task = r.json()["id"]
        r = await beta.post("/v1/work-items", json=task_item({"answer": 2}))
        assert r.status_code == 202, r.text
        b.work_items.append(r.json()["id"])
        for who, owned in ((alpha, a), (beta, b)):
            r = await who.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"})
            assert r.status_code == 201, r.text
            owned.webhooks.append(r.json()["id"])

        await wait_state(alpha, cc, {"awaiting_review"}, timeout_s=180)
        await wait_state(alpha, task, {"succeeded"})
        await wait_state(beta, b.work_items[0], {"succeeded"})
        # A zombie attempt (scheduled before everything the workflow has written since) tries to write: rejected,
        # and the rejection names both ranks in the event log.
        stale = await stack.crew.store.fenced_event(
            FencedWrite(rank=Rank(0, 1), work_item_id=cc, tenant_id=a.tenant_id, writer="zombie#1"),
            type_="late",
            data={},
        )
        assert not stale.ok
        a.work_items += [cc, task]
        for wid in a.work_items:
            a.workflows.append(
                (await alpha.get(f"/v1/work-items/{wid}", params={"live": "false"})).json()["workflow_id"]
            )
            a.artifacts += [x["id"] for x in (await alpha.get(f"/v1/work-items/{wid}/artifacts")).json()]
            a.event_ids += [e["id"] for e in (await alpha.get(f"/v1/work-items/{wid}/events")).json()]
        assert a.artifacts, "the code change stored artifacts"
        assert "stale_write_rejected" in {e["type"] for e in (await alpha.get(f"/v1/work-items/{cc}/events")).json()}
        page = (await alpha.get("/v1/work-items", params={"limit": 1})).json()
        a.page_cursor = page["next_cursor"]
        assert a.page_cursor
        for wid in b.work_items:
            b.workflows.append(
                (await beta.get(f"/v1/work-items/{wid}", params={"live": "false"})).json()["workflow_id"]
            )
        return World(a=a, b=b, code_change=cc)


async def read_sse(c: httpx.AsyncClient, path: str, *, seconds: float, **kw: Any) -> list[dict[str, Any]]:
    """The events a stream sends within `seconds` (each SSE event's JSON data)."""
    out: list[dict[str, Any]] = []

    async def consume() -> None:
        async with c.stream("GET", path, **kw) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    out.append(json.loads(line[5:].strip()))

    try:
        await asyncio.wait_for(consume(), seconds)
    except TimeoutError:
        pass
    return out
