"""The model agent inside the lifecycle, against a real local server that speaks the OpenAI protocol.

The provider is the one boundary we cannot run here, so it is a real HTTP server (tests/fakes/openai_server.py);
everything else is real: Temporal, PostgreSQL, git, the bubblewrap sandbox and pytest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from crewwork.store.tables import Artifact
from tests.conftest import Crew
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

KEY = "sk-e2e-0123456789abcdefghij"
FIX = "The sign is wrong.\n\ncalc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    # The operator allows work items to use this key variable; the worker has the key in its environment.
    monkeypatch.setenv("FAKE_PROVIDER_KEY", KEY)
    monkeypatch.setenv(
        "CREWWORK_MODEL_ENDPOINTS",
        json.dumps({"allowed_key_envs": ["FAKE_PROVIDER_KEY"], "allow_work_item_endpoints": True}),
    )
    with FakeOpenAIServer() as server:
        yield server


def model_item(repo: Path, server: FakeOpenAIServer, **kw: Any) -> dict[str, Any]:
    item = code_change(repo, [], **kw)
    item["agent"] = {
        "name": "model",
        "config": {"endpoints": {"fake": server.endpoint_config(api_key_env="FAKE_PROVIDER_KEY")}},
    }
    return item


async def test_model_agent_repairs_the_repository_end_to_end(
    crew: Crew, calc_repo: Path, provider: FakeOpenAIServer
) -> None:
    provider.enqueue(Reply.text(FIX, prompt_tokens=300, completion_tokens=40))
    wid = await crew.submit(model_item(calc_repo, provider))
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason
    assert not result.mock, "a real model agent's result is not labelled mock"
    agent = result.attempts[0].agent
    assert agent is not None and agent.agent == "model" and agent.tokens_used == 340
    assert provider.chat_requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert agent.transcript_ref is not None
    async with crew.store.session() as s:
        transcript = bytes(await s.scalar(select(Artifact.content).where(Artifact.id == agent.transcript_ref.id)))
    assert b"return a + b" in transcript and KEY.encode() not in transcript, "secrets never reach stored transcripts"
    # The model agent's call went through the attempt's gateway: one accounting path for every agent.
    assert agent.model_calls == 1 and agent.model_transcript_ref is not None
    [call] = [e for e in await crew.store.list_events(wid) if e.type == "model_call"]
    assert (call.data["input_tokens"], call.data["output_tokens"], call.data["endpoint"]) == (300, 40, "fake")


async def test_provider_500_storm_ends_dead_with_the_provider_error_never_success(
    crew: Crew, calc_repo: Path, provider: FakeOpenAIServer
) -> None:
    provider.default = Reply.error(500)
    wid = await crew.submit(model_item(calc_repo, provider))
    result = await crew.result(wid)
    assert result.state == "dead", result.reason
    assert "500" in result.reason or "provider" in result.reason.lower(), result.reason
    assert provider.call_count == 3, "one call per Temporal attempt (retry policy: 3), no client-side retries"
    assert (await crew.store.list_attempts(wid)) == []


async def test_bad_key_is_not_retried_and_fails_the_attempt(
    crew: Crew, calc_repo: Path, provider: FakeOpenAIServer
) -> None:
    provider.default = Reply.error(401)
    wid = await crew.submit(model_item(calc_repo, provider, budget={"max_attempts": 1}))
    result = await crew.result(wid)
    assert result.state == "failed", result.reason
    assert provider.call_count == 1
    [attempt] = await crew.store.list_attempts(wid)
    assert attempt.cause == "agent_error", attempt.reason
    assert "401" in attempt.reason or "auth" in attempt.reason.lower(), attempt.reason
