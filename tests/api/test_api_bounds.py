"""Parsing a request body is work the API does for whoever sends one, so it is bounded: nothing is parsed before the
sender has authenticated (and been charged), and large bodies are parsed off the event loop, a few at a time, while
another tenant's requests are answered (their latencies printed as figures with `pytest -s`, never asserted)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.api.conftest import Stack

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

JSON = {"Content-Type": "application/json"}
# Duplicate keys: refused by the body parser (422), so a 422 proves the body was parsed.
PARSED_IF_422 = '{"kind": "task", "kind": "task", "input": {}, "agent": {"name": "scripted", "config": {}}}'


async def test_an_unauthenticated_body_is_never_parsed(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.api.url, timeout=30) as c:
        for headers in ({}, {"Authorization": "Bearer cw_not_a_key"}, {"Authorization": "Basic dTpw"}):
            r = await c.post("/v1/work-items", content=PARSED_IF_422, headers={**JSON, **headers})
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["code"] == "unauthorized"
        # With the tenant's key the same body is parsed, and refused for what it is.
        r = await c.post("/v1/work-items", content=PARSED_IF_422, headers={**JSON, **stack.alpha.headers})
        assert r.status_code == 422 and r.json()["code"] == "duplicate_key"


async def test_large_bodies_are_parsed_off_the_loop_while_another_tenant_is_answered(stack: Stack) -> None:
    # ~1 MiB of numbers in agent.config: walking it took the API's event loop ~2 s per request before.
    heavy = (
        '{"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {"x": ['
        + "0," * 500_000
        + '0]}}, "budget": {"max_cost_usd": 1e999}}'
    )
    async with (
        httpx.AsyncClient(base_url=stack.api.url, headers=stack.alpha.headers, timeout=120) as a,
        stack.client(stack.beta) as b,
    ):
        await b.get("/v1/work-items")  # warm: beta's key is known to the API before the load starts

        async def beta() -> list[float]:
            took = []
            for _ in range(5):
                start = time.perf_counter()
                r = await b.get("/v1/work-items")
                took.append(time.perf_counter() - start)
                assert r.status_code == 200 and r.json()["items"] == []
            return took

        idle = await beta()
        loads = [asyncio.ensure_future(a.post("/v1/work-items", content=heavy, headers=JSON)) for _ in range(6)]
        await asyncio.sleep(0.05)
        took = await beta()
        answers = await asyncio.gather(*loads)
    # Every heavy body was parsed in full and refused for its one non-finite number, named by its field.
    assert {(r.status_code, r.json()["code"]) for r in answers} == {(422, "invalid_number")}
    assert all("budget.max_cost_usd" in r.json()["detail"] for r in answers)
    ms = sorted(round(t * 1000, 1) for t in took)
    base = sorted(round(t * 1000, 1) for t in idle)
    print(
        f"\n[bounds] 6 bodies of 1 MiB parsing: another tenant's GET answered in {ms} ms; with no load, just before: "
        f"{base} ms; ratio of the worst {ms[-1] / base[-1]:.1f}"
    )
