"""A worker killed between two model calls does not repeat the first: the retried activity resumes from the
responses its last heartbeat recorded. Real `crewwork worker` processes, real SIGKILL, real Temporal and PostgreSQL,
and a real local server speaking the OpenAI protocol (the one boundary we cannot run here)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_settings
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.reliability.conftest import pool_processes
from tests.reliability.test_faults import assert_invariants, calc, code_change, submitter, terminal

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

KEY = "sk-resume-0123456789abcdef"
MALFORMED = "I would change the minus to a plus."  # no edit blocks: the agent must ask again
FIX = "calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"


@pytest.fixture
def settings(tmp_path: Path, temporal_server: Any, pg_url: str, sandbox_backend: str) -> Any:
    return make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend)


async def test_worker_killed_between_model_calls_does_not_repeat_the_first(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = calc(tmp_path / "resume")
    with FakeOpenAIServer() as provider:
        # Call 1 answers at once; call 2 hangs long enough for the worker to be killed while it waits.
        provider.enqueue(Reply.text(MALFORMED, prompt_tokens=100, completion_tokens=10))
        provider.enqueue(Reply.text(FIX, delay_s=60))
        provider.enqueue(Reply.text(FIX, prompt_tokens=120, completion_tokens=20))
        env = {
            "FAKE_PROVIDER_KEY": KEY,
            "CREWWORK_MODEL_ENDPOINTS": json.dumps(
                {"allowed_key_envs": ["FAKE_PROVIDER_KEY"], "allow_work_item_endpoints": True}
            ),
        }
        # The submitting side checks work-item endpoints against the same operator configuration as the pools.
        monkeypatch.setenv("CREWWORK_MODEL_ENDPOINTS", env["CREWWORK_MODEL_ENDPOINTS"])
        with pool_processes(settings, **env) as stack:
            async with submitter(settings) as crew:
                item = code_change(repo, {})
                item["agent"] = {
                    "name": "model",
                    "config": {"endpoints": {"fake": provider.endpoint_config(api_key_env="FAKE_PROVIDER_KEY")}},
                }
                wid = await crew.submit(item)
                deadline = time.monotonic() + 90
                while provider.call_count < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert provider.call_count == 2, "the agent never made its second call"
                # Let the heartbeat that records call 1's response reach Temporal (heartbeats are throttled to
                # at most 0.8 x the 10 s heartbeat timeout), then kill the agent pool mid-call.
                await asyncio.sleep(9)
                stack.kill("agent-0", signal.SIGKILL)
                row = await terminal(crew, wid, timeout_s=150)
                assert row.state == "succeeded", row.reason
                calls = provider.chat_requests
                assert len(calls) == 3, f"expected call 1, call 2 (killed) and call 2 again; got {len(calls)}"
                # Only call 1 is the bare prompt; the two others carry call 1's recorded answer, replayed from the
                # heartbeat, not asked for again.
                bare = [c for c in calls if not any(m.get("role") == "assistant" for m in c.messages)]
                assert len(bare) == 1, "the first model call must not be repeated after the crash"
                for later in calls[1:]:
                    assert any(m.get("content") == MALFORMED for m in later.messages if m.get("role") == "assistant")
                (attempt,) = await crew.store.list_attempts(wid)
                assert attempt.verdict == "passed"
                await assert_invariants(crew.store, [wid])
