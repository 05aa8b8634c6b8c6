"""The model agent end to end against a real local chat-completions server and a real git repository."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crewwork.agents.base import AgentConfigError, AgentContext, AgentError, AgentInfraError, OperatorAgentSettings
from crewwork.agents.model import ModelAgent
from crewwork.config import Settings
from crewwork.models import WorkItemKind
from tests.agents.conftest import CALC, git_diff
from tests.fakes.openai_server import FakeOpenAIServer, Reply

KEY = "sk-live-9f8e7d6c5b4a39281706abcdef"
FIX = (
    "The bug is the minus sign.\n\n"
    "calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"
)

MakeCtx = Callable[..., AgentContext]


def agent_config(server: FakeOpenAIServer, **extra: Any) -> dict[str, Any]:
    return {"endpoints": {"fake": server.endpoint_config(api_key_env="FAKE_OPENAI_KEY")}, **extra}


def agent() -> ModelAgent:
    # The operator lets work items declare endpoints (off by default) and use this key variable (a work item cannot
    # name just any variable).
    operator = {"allowed_key_envs": ["FAKE_OPENAI_KEY"], "allow_work_item_endpoints": True}
    return ModelAgent(OperatorAgentSettings(model_endpoints=json.dumps(operator)), env={"FAKE_OPENAI_KEY": KEY})


async def test_correct_edit_on_first_try_changes_the_repository(
    fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path
):
    fake_openai.enqueue(Reply.text(FIX, prompt_tokens=400, completion_tokens=50))
    heartbeats: list[Any] = []
    result = await agent().run(make_ctx(agent_config(fake_openai), heartbeats=heartbeats))

    assert (git_repo / "calc.py").read_text() == CALC.replace("a - b", "a + b")
    assert "+    return a + b" in git_diff(git_repo)
    assert result.tokens_used == 450
    assert result.output is not None and result.output["files_changed"] == ["calc.py"]
    assert result.claims == "The bug is the minus sign."
    # The prompt showed the named files (and the module the test imports).
    prompt = fake_openai.chat_requests[0].last_user_message
    assert "## calc.py" in prompt and "## tests/test_calc.py" in prompt and "Fix add()" in prompt
    assert fake_openai.chat_requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert len(heartbeats) == 1 and len(heartbeats[0]["responses"]) == 1
    assert ModelAgent.mock is False


async def test_malformed_edit_then_correct_one(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path):
    fake_openai.enqueue(
        Reply.text("Sure! I changed the minus to a plus."),  # no blocks at all
        # Whole lines must match: a SEARCH of "  return a - b" must not hit the middle of "    return a - b".
        Reply.text("calc.py\n<<<<<<< SEARCH\n  return a - b\n=======\n  return a + b\n>>>>>>> REPLACE\n"),
        Reply.text(FIX),
    )
    result = await agent().run(make_ctx(agent_config(fake_openai)))
    assert (git_repo / "calc.py").read_text() == CALC.replace("a - b", "a + b")
    assert fake_openai.call_count == 3
    second, third = fake_openai.chat_requests[1], fake_openai.chat_requests[2]
    assert "no edit blocks found" in second.last_user_message
    assert "not found" in third.last_user_message and "indentation" in third.last_user_message
    # The conversation carries the refused answers, so the model sees what it said.
    assert [m["role"] for m in third.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert result.output is not None and result.output["rounds"] == 3
    transcript = json.loads(result.transcript or "{}")
    assert [c["outcome"].split(":")[0] for c in transcript["calls"]] == ["refused", "refused", "applied"]


async def test_edit_rounds_are_bounded(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path):
    fake_openai.enqueue(*[Reply.text("no edits, sorry") for _ in range(5)])
    with pytest.raises(AgentError, match="no applicable edit after 2 model call") as info:
        await agent().run(make_ctx(agent_config(fake_openai, max_edit_rounds=2)))
    assert fake_openai.call_count == 2
    assert info.value.tokens_used == 30  # type: ignore[attr-defined]
    assert git_diff(git_repo) == ""


async def test_429_with_retry_after_is_retryable_with_the_delay(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx):
    fake_openai.enqueue(Reply.error(429, "rate limited", headers={"Retry-After": "12"}))
    with pytest.raises(AgentInfraError) as info:
        await agent().run(make_ctx(agent_config(fake_openai)))
    assert info.value.retry_after_s == 12.0
    # The next Temporal attempt succeeds.
    fake_openai.enqueue(Reply.text(FIX))
    result = await agent().run(make_ctx(agent_config(fake_openai), activity_attempt=2))
    assert result.output is not None and result.output["files_changed"] == ["calc.py"]


async def test_401_is_non_retryable(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path):
    fake_openai.enqueue(Reply.error(401, f"Incorrect API key provided: {KEY}", code="invalid_api_key"))
    with pytest.raises(AgentError) as info:
        await agent().run(make_ctx(agent_config(fake_openai)))
    assert not isinstance(info.value, AgentInfraError)
    assert "auth" in str(info.value) and KEY not in str(info.value)
    assert git_diff(git_repo) == ""


async def test_500_storm_never_becomes_success(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path):
    fake_openai.enqueue(*[Reply.error(500, "internal") for _ in range(5)])
    for attempt in range(1, 6):
        with pytest.raises(AgentInfraError):
            await agent().run(make_ctx(agent_config(fake_openai), activity_attempt=attempt))
    assert fake_openai.call_count == 5
    assert git_diff(git_repo) == ""


class Crash(Exception):
    pass


async def test_resume_after_a_crash_does_not_repeat_completed_calls(
    fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path
):
    fake_openai.enqueue(Reply.text("no blocks here", prompt_tokens=100, completion_tokens=20))
    recorded: list[Any] = []

    def heartbeat_then_crash(*details: Any) -> None:
        recorded.append(details[0])
        raise Crash("worker killed after the first model call")

    with pytest.raises(Crash):
        await agent().run(make_ctx(agent_config(fake_openai), heartbeat=heartbeat_then_crash))
    assert fake_openai.call_count == 1

    # Temporal's retry: a fresh workspace (the same base commit) and the last heartbeat's details.
    fake_openai.enqueue(Reply.text(FIX, prompt_tokens=150, completion_tokens=30))
    resumed = make_ctx(agent_config(fake_openai), activity_attempt=2, resume_details=[recorded[-1]])
    result = await agent().run(resumed)

    assert fake_openai.call_count == 2  # call 1 was replayed, not repeated
    # The second request continues the same conversation: it carries the replayed first answer.
    assert fake_openai.chat_requests[1].messages[2] == {"role": "assistant", "content": "no blocks here"}
    assert (git_repo / "calc.py").read_text() == CALC.replace("a - b", "a + b")
    assert result.tokens_used == 300  # the replayed call was paid for, so it still counts
    transcript = json.loads(result.transcript or "{}")
    assert [c["replayed"] for c in transcript["calls"]] == [True, False]


async def test_resume_details_of_another_attempt_are_ignored(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx):
    stale = {"agent": "model", "format": 1, "work_item_id": "wi-1", "attempt": 7, "prompt_sha": "x",
             "responses": [{"content": "bogus"}]}  # fmt: skip
    fake_openai.enqueue(Reply.text(FIX))
    await agent().run(make_ctx(agent_config(fake_openai), resume_details=stale))
    assert fake_openai.call_count == 1


async def test_token_budget_stops_the_loop(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path):
    fake_openai.enqueue(
        Reply.text("nothing useful", prompt_tokens=600, completion_tokens=100),
        Reply.text("still nothing", prompt_tokens=700, completion_tokens=100),
        Reply.text(FIX),
    )
    with pytest.raises(AgentError, match=r"token budget exhausted: 1500 tokens used, max_tokens is 1000") as info:
        await agent().run(make_ctx(agent_config(fake_openai, max_tokens=1000)))
    assert fake_openai.call_count == 2
    assert info.value.tokens_used == 1500  # type: ignore[attr-defined]
    assert git_diff(git_repo) == ""


async def test_cost_is_computed_from_configured_prices(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx):
    fake_openai.enqueue(Reply.text(FIX, prompt_tokens=2000, completion_tokens=500))
    cfg = {"endpoints": {"fake": fake_openai.endpoint_config(price_per_1k_input_usd=0.15,
                                                             price_per_1k_output_usd=0.6)}}  # fmt: skip
    result = await agent().run(make_ctx(cfg))
    assert result.cost_usd == pytest.approx(2 * 0.15 + 0.5 * 0.6)


async def test_secrets_are_absent_from_the_transcript(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path):
    # A secret in the repository, another in the model's answer, and the key itself echoed back.
    (git_repo / "settings.py").write_text('TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123"\n')
    leaky = f"Using key {KEY}, Authorization: Bearer {KEY}, also sk-proj-AAAAAAAAAAAAAAAAAAAAAAAA.\n\n" + FIX
    fake_openai.enqueue(Reply.text(leaky))
    ctx = make_ctx(agent_config(fake_openai), instruction="Fix add() in calc.py; see settings.py")
    result = await agent().run(ctx)
    stored = (result.transcript or "") + (result.claims or "") + json.dumps(result.output)
    for secret in (KEY, "ghp_abcdefghijklmnopqrstuvwxyz0123", "sk-proj-AAAAAAAAAAAAAAAAAAAAAAAA"):
        assert secret not in stored
    assert "[REDACTED]" in stored
    assert "FAKE_OPENAI_KEY" in stored  # the variable's name is fine to record
    # The model did see the file (redaction is for what is stored, not for what is sent).
    assert "ghp_abcdefghijklmnopqrstuvwxyz0123" in fake_openai.chat_requests[0].last_user_message


async def test_diagnostics_and_review_comment_reach_the_model(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx):
    fake_openai.enqueue(Reply.text(FIX))
    ctx = make_ctx(
        agent_config(fake_openai),
        instruction="Make the tests pass.",
        attempt=2,
        diagnostics="FAILED tests/test_calc.py::test_add - assert -1 == 5",
        review_comment="Please keep mul() unchanged.",
    )
    await agent().run(ctx)
    prompt = fake_openai.chat_requests[0].last_user_message
    assert "assert -1 == 5" in prompt and "keep mul() unchanged" in prompt
    assert "## tests/test_calc.py" in prompt and "## calc.py" in prompt  # named file, then its import


async def test_task_kind_is_one_chat_call(fake_openai: FakeOpenAIServer, make_ctx: MakeCtx):
    fake_openai.enqueue(Reply.text("42"))
    ctx = make_ctx(agent_config(fake_openai), kind=WorkItemKind.task, workspace=None,
                   instruction="Answer.", input={"question": "6*7"})  # fmt: skip
    result = await agent().run(ctx)
    assert result.output == {"text": "42"}
    assert '"question": "6*7"' in fake_openai.chat_requests[0].last_user_message


async def test_operator_endpoints_from_settings_and_missing_configuration(
    fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("CREWWORK_MODEL_ENDPOINTS", json.dumps({"local": fake_openai.endpoint_config()}))
    fake_openai.enqueue(Reply.text(FIX))
    result = await ModelAgent(OperatorAgentSettings.of(Settings()), env={}).run(make_ctx({"max_edit_rounds": 2}))
    assert result.output is not None and result.output["endpoint"] == "local"
    with pytest.raises(AgentError, match="no model endpoint is configured"):
        await ModelAgent(OperatorAgentSettings(), env={}).run(make_ctx({}))


def test_validate_config_rejects_unknown_fields():
    ModelAgent.validate_config(WorkItemKind.code_change, {"max_edit_rounds": 2})
    with pytest.raises(AgentConfigError, match="max_edit_roundz"):
        ModelAgent.validate_config(WorkItemKind.code_change, {"max_edit_roundz": 2})
    with pytest.raises(AgentConfigError, match="NAME of an environment variable"):
        ModelAgent.validate_config(
            WorkItemKind.code_change,
            {"endpoints": {"x": {"base_url": "http://h/v1", "model": "m", "api_key_env": KEY}}},
        )


async def test_slow_call_keeps_heartbeating_with_the_recorded_progress(
    fake_openai: FakeOpenAIServer, make_ctx: MakeCtx
):
    fake_openai.enqueue(Reply.text("no blocks"), Reply.text(FIX, delay_s=0.6))
    heartbeats: list[Any] = []
    await agent().run(make_ctx(agent_config(fake_openai, heartbeat_interval_s=0.1), heartbeats=heartbeats))
    # Liveness heartbeats while call 2 is in flight repeat call 1's response, so a crash then loses nothing.
    during = [h for h in heartbeats if len(h["responses"]) == 1]
    assert len(during) >= 3
    assert all(h["responses"][0]["content"] == "no blocks" for h in during)
    assert len(heartbeats[-1]["responses"]) == 2


async def test_a_failover_is_recorded_in_the_transcript(make_ctx: MakeCtx, git_repo: Path):
    with FakeOpenAIServer() as primary, FakeOpenAIServer() as backup:
        primary.enqueue(Reply.error(503, "overloaded"))
        backup.enqueue(Reply.text(FIX))
        cfg = {
            "endpoints": {"primary": primary.endpoint_config(), "backup": backup.endpoint_config()},
            "routes": {"edit": ["primary", "backup"]},
        }
        result = await agent().run(make_ctx(cfg))
    transcript = json.loads(result.transcript or "{}")
    assert transcript["calls"][0]["endpoint"] == "backup"
    assert "overloaded" in transcript["calls"][0]["failovers"][0]
    assert [r["endpoint"] for r in transcript["route"]] == ["primary", "backup"]


async def test_huge_responses_stay_out_of_heartbeat_details(
    fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, monkeypatch: pytest.MonkeyPatch
):
    import crewwork.agents.model as model_module

    monkeypatch.setattr(model_module, "RESUME_MAX_BYTES", 2000)
    fake_openai.enqueue(Reply.text("x" * 5000), Reply.text(FIX))
    heartbeats: list[Any] = []
    await agent().run(make_ctx(agent_config(fake_openai), heartbeats=heartbeats))
    # The oversized first answer is not in the details: a resumed run would ask again rather than fail.
    assert all(h["responses"] == [] for h in heartbeats)


async def test_the_prompt_carries_a_repository_map_of_the_base_commit(
    fake_openai: FakeOpenAIServer, make_ctx: MakeCtx, git_repo: Path, tmp_path: Path
):
    import subprocess
    from types import SimpleNamespace

    from crewwork.config.codeintel import CodeIntelSettings

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=git_repo, capture_output=True, text=True, check=True)
    # What the agent pool gives: the workspace's private git directory and base commit, the registration's id.
    workspace = SimpleNamespace(git=SimpleNamespace(path=git_repo / ".git"), base_commit=head.stdout.strip())
    extra = {"repo_id": "repo_abc", "codeintel": CodeIntelSettings(), "codeintel_dir": str(tmp_path / "ci")}
    for tokens, shown in ((None, True), (0, False)):
        fake_openai.enqueue(Reply.text(FIX))
        ctx = make_ctx(agent_config(fake_openai, repo_map_tokens=tokens), host_workspace=workspace, extra=extra)
        await agent().run(ctx)
        prompt = fake_openai.chat_requests[-1].last_user_message
        assert ("# Repository map" in prompt) is shown
        if shown:
            section = prompt.split("# Repository map", 1)[1]
            assert "calc.py:\n    1│def add(a, b):" in section
        subprocess.run(["git", "checkout", "-q", "--", "."], cwd=git_repo, check=True)
    assert (tmp_path / "ci" / "repo_abc" / f"{workspace.base_commit}.json.gz").is_file()
