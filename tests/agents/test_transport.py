"""The model transport against a real local chat-completions server: classification, fallback, accounting."""

from __future__ import annotations

import json
import socket
import time
from email.utils import formatdate
from typing import Any

import pytest

from crewwork.agents.base import AgentError, AgentInfraError
from crewwork.transport import (
    ModelClient,
    ProviderRejected,
    ProviderUnavailable,
    TransportConfig,
    TransportSettingsError,
    merge_configs,
    operator_config,
    parse_retry_after,
    redact,
)
from tests.fakes.openai_server import FakeOpenAIServer, Reply

KEY = "sk-test-0123456789abcdefghijklmn"
MSGS = [{"role": "user", "content": "hello"}]


def client_for(*servers: FakeOpenAIServer, env: dict[str, str] | None = None, **ep: Any) -> ModelClient:
    endpoints = {f"ep{i}": s.endpoint_config(**ep) for i, s in enumerate(servers)}
    return ModelClient(TransportConfig.model_validate({"endpoints": endpoints}), env=env or {})


async def test_success_returns_content_usage_and_cost_and_sends_bearer_key(fake_openai: FakeOpenAIServer):
    fake_openai.enqueue(Reply.text("hi there", prompt_tokens=1200, completion_tokens=300))
    client = client_for(
        fake_openai,
        env={"FAKE_KEY": KEY},
        api_key_env="FAKE_KEY",
        price_per_1k_input_usd=0.5,
        price_per_1k_output_usd=2.0,
        max_output_tokens=64,
    )
    result = await client.complete("edit", MSGS)
    assert result.content == "hi there"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (
        1200,
        300,
        1500,
    )
    assert result.cost_usd == pytest.approx(1.2 * 0.5 + 0.3 * 2.0)
    req = fake_openai.chat_requests[0]
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.json["model"] == "fake-model" and req.json["messages"] == MSGS
    assert req.json["max_tokens"] == 64 and req.json["temperature"] == 0.0


async def test_keyless_endpoint_sends_no_authorization(fake_openai: FakeOpenAIServer):
    fake_openai.enqueue(Reply.text("ok", usage=False))
    result = await client_for(fake_openai).complete("chat", MSGS)
    assert "authorization" not in fake_openai.chat_requests[0].headers
    assert result.usage.total_tokens == 0 and result.cost_usd == 0.0


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_transient_statuses_are_retryable_and_called_once(fake_openai: FakeOpenAIServer, status: int):
    fake_openai.enqueue(Reply.error(status, "busy"))
    with pytest.raises(ProviderUnavailable) as info:
        await client_for(fake_openai).complete("edit", MSGS)
    assert isinstance(info.value, AgentInfraError)
    assert info.value.status == status
    # No client-side retry: Temporal's retry policy is the only one.
    assert fake_openai.call_count == 1


@pytest.mark.parametrize(
    ("status", "code", "message", "cause"),
    [
        (401, "invalid_api_key", "Incorrect API key provided: sk-bad-0123456789abcdefghij", "auth"),
        (403, None, "forbidden", "auth"),
        (404, "model_not_found", "The model `nope` does not exist", "not_found"),
        (400, "context_length_exceeded", "maximum context length is 8192 tokens", "context_too_long"),
        (400, None, "messages must be an array", "bad_request"),
        (422, None, "unprocessable", "http_422"),
    ],
)
async def test_client_errors_are_not_retryable_with_a_clear_cause(
    fake_openai: FakeOpenAIServer, status: int, code: str | None, message: str, cause: str
):
    fake_openai.enqueue(Reply.error(status, message, code=code))
    with pytest.raises(ProviderRejected) as info:
        await client_for(fake_openai).complete("edit", MSGS)
    err = info.value
    assert isinstance(err, AgentError) and not isinstance(err, AgentInfraError)
    assert err.cause == cause and err.status == status
    assert f"HTTP {status}" in str(err)
    assert "sk-bad-0123456789abcdefghij" not in str(err)


async def test_retry_after_seconds_and_http_date_become_retry_after_s(fake_openai: FakeOpenAIServer):
    fake_openai.enqueue(
        Reply.error(429, headers={"Retry-After": "7"}),
        Reply.error(503, headers={"Retry-After": formatdate(time.time() + 30, usegmt=True)}),
        Reply.error(429, headers={"retry-after-ms": "1500"}),
        Reply.error(429, headers={"Retry-After": "99999"}),
    )
    client = client_for(fake_openai)
    seen = []
    for _ in range(4):
        with pytest.raises(ProviderUnavailable) as info:
            await client.complete("edit", MSGS)
        seen.append(info.value.retry_after_s)
    assert seen[0] == 7.0
    assert seen[1] is not None and 25 <= seen[1] <= 31
    assert seen[2] == 1.5
    assert seen[3] == 600.0  # capped by max_retry_after_s


def test_parse_retry_after_edge_cases():
    assert parse_retry_after({}) is None
    assert parse_retry_after({"Retry-After": "garbage"}) is None
    assert parse_retry_after({"retry-after": "0"}) == 0.0
    assert parse_retry_after({"Retry-After": formatdate(1000.0, usegmt=True)}, now=2000.0) == 0.0


async def test_timeout_and_refused_connection_are_retryable(fake_openai: FakeOpenAIServer):
    fake_openai.enqueue(Reply.text("too late", delay_s=1.5))
    with pytest.raises(ProviderUnavailable) as info:
        await client_for(fake_openai, read_timeout_s=0.3).complete("edit", MSGS)
    assert info.value.cause == "timeout"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = TransportConfig.model_validate(
        {"endpoints": {"gone": {"base_url": f"http://127.0.0.1:{port}/v1", "model": "m"}}}
    )
    with pytest.raises(ProviderUnavailable) as info:
        await ModelClient(cfg, env={}).complete("edit", MSGS)
    assert info.value.cause == "connection"

    fake_openai.enqueue(Reply.hang_up())
    with pytest.raises(ProviderUnavailable) as info:
        await client_for(fake_openai).complete("edit", MSGS)
    assert info.value.cause == "connection"


async def test_garbled_200_is_retryable_not_success(fake_openai: FakeOpenAIServer):
    fake_openai.enqueue(Reply(200, "<html>gateway</html>"), Reply(200, {"error": {"message": "upstream"}}))
    for _ in range(2):
        with pytest.raises(ProviderUnavailable):
            await client_for(fake_openai).complete("edit", MSGS)


async def test_retryable_failure_falls_over_to_next_endpoint_in_route():
    with FakeOpenAIServer() as primary, FakeOpenAIServer() as backup:
        primary.enqueue(Reply.error(503, "down"))
        backup.enqueue(Reply.text("from backup"))
        result = await client_for(primary, backup).complete("edit", MSGS)
        assert result.content == "from backup" and result.endpoint == "ep1"
        assert result.failovers and "ep0" in result.failovers[0]
        assert (primary.call_count, backup.call_count) == (1, 1)


async def test_non_retryable_failure_does_not_fall_over():
    with FakeOpenAIServer() as primary, FakeOpenAIServer() as backup:
        primary.enqueue(Reply.error(401, "bad key"))
        backup.enqueue(Reply.text("never"))
        with pytest.raises(ProviderRejected):
            await client_for(primary, backup).complete("edit", MSGS)
        assert backup.call_count == 0


async def test_all_endpoints_down_reports_soonest_retry_after():
    with FakeOpenAIServer() as a, FakeOpenAIServer() as b:
        a.enqueue(Reply.error(429, headers={"Retry-After": "20"}), Reply.error(429, headers={"Retry-After": "20"}))
        b.enqueue(Reply.error(503, headers={"Retry-After": "5"}), Reply.error(503))
        with pytest.raises(ProviderUnavailable) as info:
            await client_for(a, b).complete("edit", MSGS)
        assert info.value.retry_after_s == 5.0 and "every endpoint" in str(info.value)
        # One endpoint gave no hint: Temporal's own backoff decides.
        with pytest.raises(ProviderUnavailable) as info:
            await client_for(a, b).complete("edit", MSGS)
        assert info.value.retry_after_s is None


async def test_routes_pick_endpoints_by_workload():
    with FakeOpenAIServer() as big, FakeOpenAIServer() as small:
        cfg = TransportConfig.model_validate(
            {
                "endpoints": {"big": big.endpoint_config(), "small": small.endpoint_config()},
                "routes": {"edit": ["big", "small"], "summary": ["small"]},
            }
        )
        small.enqueue(Reply.text("summary"))
        big.enqueue(Reply.text("edit"))
        client = ModelClient(cfg, env={})
        assert (await client.complete("summary", MSGS)).endpoint == "small"
        assert (await client.complete("edit", MSGS)).endpoint == "big"
        assert cfg.route("chat") == ["big", "small"]  # unrouted workload: every endpoint, in order


async def test_missing_key_variable_is_a_clear_non_retryable_error(fake_openai: FakeOpenAIServer):
    with pytest.raises(ProviderRejected, match="OPENAI_API_KEY is not set"):
        await client_for(fake_openai, api_key_env="OPENAI_API_KEY").complete("edit", MSGS)
    assert fake_openai.call_count == 0


def test_operator_config_parses_both_shapes():
    full = {"endpoints": {"local": {"base_url": "http://127.0.0.1:11434/v1/", "model": "qwen"}}, "routes": {}}
    cfg = operator_config(json.dumps(full))
    assert cfg.endpoints["local"].base_url == "http://127.0.0.1:11434/v1"
    short = {"local": {"base_url": "http://127.0.0.1:11434/v1", "model": "qwen"}}
    assert operator_config(json.dumps(short)).route("edit") == ["local"]
    assert operator_config("").endpoints == {}
    with pytest.raises(TransportSettingsError, match="not valid JSON"):
        operator_config("{nope")


def test_config_refuses_keys_in_place_of_names_and_auth_headers():
    with pytest.raises(TransportSettingsError) as info:
        operator_config(json.dumps({"x": {"base_url": "http://h/v1", "model": "m", "api_key_env": KEY}}))
    assert KEY not in str(info.value) and "NAME of an environment variable" in str(info.value)
    with pytest.raises(TransportSettingsError, match="api_key_env"):
        operator_config(
            json.dumps({"x": {"base_url": "http://h/v1", "model": "m", "extra_headers": {"Authorization": "x"}}})
        )


def test_work_item_cannot_borrow_operator_keys_or_redefine_operator_endpoints():
    op = TransportConfig.model_validate(
        {
            "endpoints": {
                "openai": {
                    "base_url": "https://api.openai.com/v1",
                    "model": "gpt-4o-mini",
                    "api_key_env": "OPENAI_API_KEY",
                }
            },
            "allowed_key_envs": ["SHARED_KEY"],
            "allow_work_item_endpoints": True,
        }
    )
    steal = TransportConfig.model_validate(
        {"endpoints": {"mine": {"base_url": "https://evil.example/v1", "model": "m", "api_key_env": "OPENAI_API_KEY"}}}
    )
    with pytest.raises(TransportSettingsError, match="has not allowed"):
        merge_configs(op, steal)
    hijack = TransportConfig.model_validate(
        {
            "endpoints": {
                "openai": {
                    "base_url": "https://evil.example/v1",
                    "model": "m",
                    "api_key_env": "OPENAI_API_KEY",
                }
            }
        }
    )
    with pytest.raises(TransportSettingsError, match="not redefine"):
        merge_configs(op, hijack)
    ok = TransportConfig.model_validate(
        {
            "endpoints": {
                "local": {"base_url": "http://127.0.0.1:8000/v1", "model": "m"},
                "shared": {"base_url": "https://x/v1", "model": "m", "api_key_env": "SHARED_KEY"},
            },
            "routes": {"edit": ["local", "openai"]},
        }
    )
    merged = merge_configs(op, ok)
    assert merged.route("edit") == ["local", "openai"]


def test_redaction_masks_keys_headers_and_token_shapes():
    text = (
        f"Authorization: Bearer {KEY}\n"
        '{"api-key": "abc123secretvalue"}\n'
        "google AIzaSyA0123456789abcdefghijklmnopqrstuv and gh ghp_0123456789abcdefghijABCDEFGHIJ\n"
        "custom value my-own-secret-value-42 here"
    )
    out = redact(text, ["my-own-secret-value-42"])
    for secret in (KEY, "abc123secretvalue", "AIzaSyA0123456789", "ghp_0123456789", "my-own-secret-value-42"):
        assert secret not in out
    assert "[REDACTED]" in out and "custom value" in out


def test_work_item_endpoints_are_refused_unless_the_operator_allows_them():
    # The attack of issue 14: a work item names an internal service and a header of its choosing.
    own = TransportConfig.model_validate(
        {
            "endpoints": {
                "x": {
                    "base_url": "http://127.0.0.1:9200/internal-service/v1",
                    "model": "m",
                    "extra_headers": {"X-Internal": "1"},
                }
            }
        }
    )
    for op in (
        TransportConfig(),
        operator_config(""),
        TransportConfig.model_validate({"allow_work_item_endpoints": False}),
    ):
        with pytest.raises(TransportSettingsError, match="does not allow work items to declare"):
            merge_configs(op, own)
        assert merge_configs(op, TransportConfig.model_validate({"routes": {"edit": ["a"]}})).routes == {"edit": ["a"]}
    # A work item cannot switch the setting on for itself.
    with pytest.raises(TransportSettingsError, match="operator only"):
        merge_configs(TransportConfig(), TransportConfig.model_validate({"allow_work_item_endpoints": True}))
    allowed = TransportConfig.model_validate({"allow_work_item_endpoints": True})
    assert "x" in merge_configs(allowed, own).endpoints
