"""The agent step's gateway against the real store (SQLite and PostgreSQL): every call is a fenced event of the
attempt, written as the call ends, so the spend of an activity attempt that crashed mid-run is still counted by the
attempt Temporal retries, and a zombie's call record is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.config import Settings
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.steps.agent import AgentStepInput
from crewwork.steps.agent.metering import attempt_gateway, budget_for
from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.ports import Ports
from crewwork.store.store import Rank, Store
from tests.fakes.model_server import FakeModelServer, Turn

KEY = "sk-metering-0123456789abcdefghij"


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as s:
        yield s


async def _setup(
    store: Store, tmp_path: Path, server: FakeModelServer, budget: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[Ports, AgentStepInput]:
    endpoints = {"endpoints": {"p": {"base_url": server.base_url, "model": "m", "api_key_env": "METER_KEY",
                                     "price_per_1k_input_usd": 1.0, "price_per_1k_output_usd": 1.0}}}  # fmt: skip
    # The operator's endpoints in the environment, where the agents (and so the gateway) read them.
    monkeypatch.setenv("CREWWORK_MODEL_ENDPOINTS", json.dumps(endpoints))
    settings = Settings(data_dir=tmp_path)
    tid = await store.ensure_tenant(f"metering-{tmp_path.name}")
    spec = WorkItemSpec.model_validate(
        {"kind": "task", "input": {}, "agent": {"name": "model", "config": {}}, "budget": budget}
    )
    row, _ = await store.create_work_item(tenant_id=tid, spec=spec, base_commit=None, repo_path=None)
    return Ports.build(store, settings), AgentStepInput(
        work_item_id=row.id, tenant_id=tid, step=3, attempt=1, spec=spec
    )


async def _call(gw: Any) -> httpx.Response:
    h = gw.handle
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(h.socket_path)), timeout=30) as c:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}
        return await c.post("http://gw/v1/chat/completions", json=body, headers={"authorization": f"Bearer {h.token}"})


async def test_a_crashed_activity_attempts_calls_count_against_the_retry(
    any_store: Store, tmp_path: Path, server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METER_KEY", KEY)
    server.script(*[Turn.say("x", prompt_tokens=100, completion_tokens=20)] * 4)
    ports, inp = await _setup(any_store, tmp_path, server, {"max_tokens": 300}, monkeypatch)
    first = AttemptWriter(any_store, inp.work_item_id, inp.tenant_id, Rank(3, 1), "run_agent#1")
    assert (await first.set_state(WorkItemState.running, "attempt 1")).ok
    async with attempt_gateway(ports, first, inp, "model", {}) as gw:
        assert gw is not None
        assert (await _call(gw)).status_code == 200
        assert (await _call(gw)).status_code == 200
        # ... and the worker dies here: no outcome is ever recorded, its gateway's memory is gone.
    calls = [e for e in await any_store.list_events(inp.work_item_id) if e.type == "model_call"]
    assert [(e.data["activity_attempt"], e.data["input_tokens"], e.rank) for e in calls] == [
        (1, 100, Rank(3, 1).encode()),
        (1, 100, Rank(3, 1).encode()),
    ]
    # Temporal retries the step: the new attempt starts with what the first one spent.
    budget, tokens, cost = await budget_for(ports, inp)
    assert (tokens, round(cost, 6), budget.max_tokens) == (240, 0.24, 300)
    retry = AttemptWriter(any_store, inp.work_item_id, inp.tenant_id, Rank(3, 2), "run_agent#2")
    async with attempt_gateway(ports, retry, inp, "model", {}) as gw:
        assert gw is not None and gw.ledger.tokens == 240
        assert (await _call(gw)).status_code == 200  # 240 + 120 crosses 300: answered, and the next is refused
        refused = await _call(gw)
        assert refused.status_code == 429 and "360 tokens used" in refused.text
    assert len(server.model_calls) == 3
    # The zombie (the first attempt, woken late) is refused at its next call record, and its gateway stops.
    async with attempt_gateway(ports, first, inp, "model", {}) as zombie:
        assert zombie is not None
        zombie.ledger.budget.max_tokens = None
        assert (await _call(zombie)).status_code == 200
        assert zombie.stopped.is_set() and zombie.stop_kind == "superseded"
        assert (await _call(zombie)).status_code == 403
