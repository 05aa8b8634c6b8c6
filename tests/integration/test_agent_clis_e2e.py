"""Each agent CLI repairs a failing test through crewwork's whole lifecycle, as the delegated runner, reaching its
model only through the attempt's gateway; then a replay reproduces the attempt with no model call.

Real: Temporal (dev server), PostgreSQL, the worker pools, git, the bubblewrap sandbox, pytest, the CLIs
(scripts/test-env.sh installs them), the gateway. The model provider is a local server speaking the providers'
protocols (tests/fakes/model_server.py), scripted so the CLI's own tools print its environment and config, then fix
calc.py. The narrower tests (each backend, the budget) are in tests/agents/test_agent_clis.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from crewwork.agents.cli_registry import ADAPTERS
from crewwork.steps.ports import Ports
from crewwork.steps.replay.activity import replay_attempt
from crewwork.temporal.devserver import DevServer
from tests.agents.cli_scripts import (
    KEY_ENV,
    PROVIDER_KEY,
    command_spec,
    install_dir,
    operator_endpoints,
    script,
    snooped,
)
from tests.conftest import ApiServer, make_settings, running_crew
from tests.fakes.model_server import FakeModelServer
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.mark.parametrize("adapter", ["codex", "claude-code", "mini-swe-agent"])
async def test_agent_cli_repairs_the_test_as_delegated_runner_and_replays_without_a_model(
    adapter: str,
    tmp_path: Path,
    temporal_server: DevServer,
    pg_url: str,
    sandbox_backend: str,
    calc_repo: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if ADAPTERS[adapter].locate(install_dir(adapter)) is None:
        pytest.skip(f"{adapter} is not installed in {install_dir(adapter)} (scripts/test-env.sh installs it)")
    monkeypatch.setenv(KEY_ENV, PROVIDER_KEY)  # the agent pool's environment: the key lives here, and only here
    with FakeModelServer() as server:
        server.script(*script(adapter, provider_port=server.port))
        # The operator's settings, in the environment: the agent's child process reads them from there.
        monkeypatch.setenv("CREWWORK_MODEL_ENDPOINTS", json.dumps(operator_endpoints(server.base_url)))
        monkeypatch.setenv("CREWWORK_COMMAND_AGENTS", json.dumps({"commands": {"cli": command_spec(adapter)}}))
        monkeypatch.setenv("CREWWORK_DELEGATED_RUNNER", "cli")
        settings = make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend)
        async with running_crew(settings) as crew:
            tenant = f"cli-e2e-{adapter}-{tmp_path.name[-6:]}"
            crew.tenant_id = await crew.store.ensure_tenant(tenant)
            # The item asks for the model agent; the operator's delegated runner runs it.
            item = code_change(calc_repo, [], agent={"name": "model", "config": {}}, budget={"max_attempts": 1})
            wid = await crew.submit(item)
            result = await crew.result(wid, timeout_s=300)
            assert result.state == "succeeded", (result.reason, [(a.reason, a.agent) for a in result.attempts])
            assert not result.mock
            outcome = result.attempts[0].agent
            assert outcome.agent == "command" and "delegated runner 'cli'" in (outcome.selected_because or "")
            # Usage and cost of every call are on the attempt, and each call is a fenced event of it.
            calls = server.model_calls
            assert outcome.model_calls == len(calls) >= 3
            assert outcome.tokens_used == sum(120 if c.has_tools else 12 for c in calls)
            assert outcome.cost_usd > 0
            events = [e for e in await crew.store.list_events(wid) if e.type == "model_call"]
            assert len(events) == len(calls) and all(e.rank is not None for e in events)
            # The key never reached the sandbox: not in its environment, its config, /proc, nor anything it sent.
            seen = snooped(server.requests)
            assert "cwgw-" in seen
            # The sandbox reaches the gateway's relay on its own loopback, and nothing else: not the provider's port.
            assert "reach gateway 0" in seen and "reach provider 0" not in seen and "reach provider 1" in seen
            assert not any(PROVIDER_KEY in r.text() for r in server.requests)
            assert all(PROVIDER_KEY in r.headers.get("authorization", r.headers.get("x-api-key", "")) for r in calls)
            # The transcript is kept, linked from the evidence, with every exchange and no secret.
            assert outcome.model_transcript_ref is not None
            transcript = await crew.store.artifact_content(outcome.model_transcript_ref.id)
            assert transcript is not None and PROVIDER_KEY.encode() not in transcript
            assert transcript.count(b'"request_key"') == len(calls)

            # Replay: the same agent, a fresh sandbox on the same base, the gateway answering from the transcript.
            before = len(server.requests)
            report = await replay_attempt(Ports.build(crew.store, settings), wid, 1)
            assert len(server.requests) == before, "a replay calls no model"
            assert report.provider_calls == 0 and report.replayed_calls == report.recorded_calls == len(calls)
            assert report.same_diff, report.replayed_diff
            assert report.same_questions, report.divergences
            assert report.verdict.startswith("passed")
            if adapter == "codex":  # the API's route: the replay runs on the agent pool (ReplayWorkflow)
                await replay_through_the_api(crew, settings, tenant, wid, len(calls), server)


async def replay_through_the_api(
    crew: Any, settings: Any, tenant: str, wid: str, calls: int, server: FakeModelServer
) -> None:
    _kid, key = await crew.store.create_api_key(tenant)
    before = len(server.requests)
    async with ApiServer(settings) as api, api.client(key) as http:
        assert (await http.post(f"/v1/work-items/{wid}/replay", params={"attempt": 7})).status_code == 404
        started = await http.post(f"/v1/work-items/{wid}/replay", params={"attempt": 1})
        assert started.status_code == 202, started.text
        where = started.headers["location"]
        deadline = time.monotonic() + 240
        while (view := (await http.get(where)).json())["status"] == "running" and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
    assert view["status"] == "completed", view
    report = view["report"]
    assert report["provider_calls"] == 0 and report["replayed_calls"] == calls and report["same_diff"]
    assert len(server.requests) == before, "a replay calls no model"
