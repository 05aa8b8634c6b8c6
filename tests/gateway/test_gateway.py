"""The model gateway on its own: a real unix-socket HTTP server, a real local provider speaking the three protocols
(tests/fakes/model_server.py), real HTTP in between. What an agent in a sandbox can and cannot do with it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.config.gateway import GatewaySettings
from crewwork.gateway.exchanges import parse
from crewwork.gateway.forwarder import AttemptGateway, CallRecord
from crewwork.gateway.ledger import Budget
from crewwork.gateway.replayer import Replayer
from crewwork.transport.config import TransportConfig
from tests.fakes.model_server import FakeModelServer, Turn

KEY = "sk-gateway-test-0123456789abcdefghij"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def body(protocol: str, *, stream: bool = False, model: str = "whatever") -> dict[str, Any]:
    if protocol == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": stream}
    if protocol == "responses":
        return {"model": model, "input": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": stream}
    return {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "stream": stream}  # fmt: skip


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as s:
        yield s


def transport(*endpoints: tuple[str, str, list[str]], **extra: Any) -> TransportConfig:
    return TransportConfig.model_validate(
        {
            "endpoints": {
                name: {"base_url": url, "model": f"model-{name}", "protocols": protocols, "api_key_env": "KEY",
                       "price_per_1k_input_usd": 1.0, "price_per_1k_output_usd": 2.0, **extra}
                for name, url, protocols in endpoints
            }
        }
    )  # fmt: skip


class Client:
    def __init__(self, gw: AttemptGateway) -> None:
        self.gw = gw
        self.token = gw.token
        self.http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(gw.handle.socket_path)), base_url="http://gw", timeout=30
        )

    async def call(self, protocol: str, payload: dict[str, Any], token: str | None = None) -> httpx.Response:
        auth = (
            {"x-api-key": token or self.token}
            if protocol == "messages"
            else {"authorization": f"Bearer {token or self.token}"}
        )
        return await self.http.post(PATHS[protocol], json=payload, headers=auth)


async def gateway(
    tmp_path: Path, tc: TransportConfig, route: list[str] | None = None, **kw: Any
) -> AsyncIterator[tuple[AttemptGateway, Client]]:
    settings = kw.pop("settings", GatewaySettings(calls_per_minute=0))
    async with AttemptGateway(
        root=tmp_path,
        transport=tc,
        route=route or list(tc.endpoints),
        settings=settings,
        budget=kw.pop("budget", Budget()),
        tenant_id=kw.pop("tenant_id", "t1"),
        header={},
        env={"KEY": KEY},
        **kw,
    ) as gw:
        client = Client(gw)
        async with client.http:
            yield gw, client


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
async def test_each_protocol_is_forwarded_with_the_key_added_here_and_accounted(
    protocol: str, stream: bool, tmp_path: Path, server: FakeModelServer
) -> None:
    server.script(Turn.call("bash", {"command": "ls"}, prompt_tokens=300, completion_tokens=40))
    tc = transport(("p", server.base_url, ["chat", "responses", "messages"]))
    async for gw, client in gateway(tmp_path, tc):
        response = await client.call(protocol, body(protocol, stream=stream))
        assert response.status_code == 200, response.text
        assert ('"bash"' in response.text) or ("bash" in response.text)
        assert gw.ledger.tokens == 340 and gw.ledger.cost_usd == pytest.approx(0.3 + 0.08)
        transcript = gw.transcript_bytes()
    [seen] = server.model_calls
    assert seen.protocol == protocol and seen.json["model"] == "model-p", "the endpoint's model, not the agent's"
    assert KEY in (seen.headers.get("authorization", "") + seen.headers.get("x-api-key", ""))
    if protocol == "chat" and stream:
        assert seen.json["stream_options"] == {"include_usage": True}, "the gateway asks for a stream's usage"
    head, exchanges = parse(transcript)
    assert head["tokens"] == 340 and exchanges[0]["usage"]["reported"] is True
    assert KEY.encode() not in transcript


async def test_without_the_attempts_token_nothing_is_forwarded(tmp_path: Path, server: FakeModelServer) -> None:
    tc = transport(("p", server.base_url, ["chat", "messages"]))
    async for gw, client in gateway(tmp_path, tc):
        for protocol in ("chat", "messages"):
            for token in ("wrong", KEY, ""):
                response = await client.call(protocol, body(protocol), token=token or "x")
                assert response.status_code == 401
        denied = await client.http.post(PATHS["chat"], json=body("chat"))
        assert denied.status_code == 401
        token = gw.token
    assert server.requests == []
    assert gw.token == "" and token.startswith("cwgw-"), "the token is forgotten when the attempt ends"


async def test_only_the_routes_endpoints_that_speak_the_protocol_are_ever_called(
    tmp_path: Path, server: FakeModelServer
) -> None:
    with FakeModelServer() as other, FakeModelServer() as outside:
        tc = transport(("chat-only", server.base_url, ["chat"]), ("anthropic", other.base_url, ["messages"]),
                       ("not-on-route", outside.base_url, ["chat", "messages", "responses"]))  # fmt: skip
        async for _gw, client in gateway(tmp_path, tc, route=["chat-only", "anthropic"]):
            # Naming another endpoint's model, or the one off the route, picks nothing else.
            assert (await client.call("chat", body("chat", model="model-not-on-route"))).status_code == 200
            assert (await client.call("messages", body("messages", model="model-chat-only"))).status_code == 200
            refused = await client.call("responses", body("responses"))
            assert refused.status_code == 400 and "responses" in refused.json()["error"]["message"]
            other_path = await client.http.post(
                "/v1/embeddings", json={"model": "x"}, headers={"authorization": f"Bearer {client.token}"}
            )
            assert other_path.status_code == 404
        assert [r.protocol for r in server.model_calls] == ["chat"] and [r.protocol for r in other.model_calls] == [
            "messages"
        ]
        assert outside.requests == []


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
async def test_a_spent_budget_refuses_the_next_call_in_the_protocols_own_error_shape(
    protocol: str, tmp_path: Path, server: FakeModelServer
) -> None:
    server.script(*[Turn.say("x", prompt_tokens=100, completion_tokens=20)] * 3)
    tc = transport(("p", server.base_url, ["chat", "responses", "messages"]))
    async for gw, client in gateway(tmp_path, tc, budget=Budget(max_tokens=200, spent_before_tokens=50)):
        assert (await client.call(protocol, body(protocol))).status_code == 200
        assert (await client.call(protocol, body(protocol))).status_code == 200  # crosses the budget: answered
        assert not gw.stopped.is_set()
        refused = await client.call(protocol, body(protocol))
        assert gw.stopped.is_set() and gw.stop_kind == "budget"
    assert len(server.model_calls) == 2, "overshoot is at most the one call that crossed the budget"
    data = refused.json()
    if protocol == "messages":
        assert refused.status_code == 403 and data["type"] == "error" and data["error"]["type"] == "permission_error"
    else:
        assert refused.status_code == 429 and data["error"]["type"] == "insufficient_quota"
    assert "token budget exhausted: 290 tokens used" in json.dumps(data)


async def test_bounds_on_request_size_stream_length_and_rate(tmp_path: Path, server: FakeModelServer) -> None:
    server.script(Turn.say("y" * 5000), Turn.say("z"))
    tc = transport(("p", server.base_url, ["chat"]))
    settings = GatewaySettings(max_request_bytes=2048, max_response_bytes=1500, calls_per_minute=0)
    async for gw, client in gateway(tmp_path, tc, settings=settings):
        big = body("chat")
        big["messages"][0]["content"] = "x" * 4096
        assert (await client.call("chat", big)).status_code == 413
        assert server.model_calls == [], "a request over the bound is not read, nor forwarded"
        cut = await client.call("chat", body("chat", stream=True))
        assert cut.status_code == 200 and len(cut.content) <= 1500 + 64 * 1024
        _head, exchanges = parse(gw.transcript_bytes())
        assert exchanges[-1]["cut"] == "the stream is longer than max_response_bytes"
    limited = GatewaySettings(calls_per_minute=6)  # a burst of one call, then one every ten seconds
    async for _gw, client in gateway(tmp_path / "rate", tc, settings=limited, tenant_id="rate-tenant"):
        assert (await client.call("chat", body("chat"))).status_code == 200
        second = await client.call("chat", body("chat"))
        assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1


async def test_a_failing_endpoint_fails_over_to_the_next_before_anything_is_answered(
    tmp_path: Path, server: FakeModelServer
) -> None:
    with FakeModelServer() as broken:
        broken.script(Turn.fail(503, "overloaded"))
        server.script(Turn.call("bash", {"command": "ls"}))
        tc = transport(("first", broken.base_url, ["chat"]), ("second", server.base_url, ["chat"]))
        async for gw, client in gateway(tmp_path, tc):
            assert (await client.call("chat", body("chat", model="model-first"))).status_code == 200
            _head, [exchange] = parse(gw.transcript_bytes())
        assert exchange["endpoint"] == "second" and exchange["failovers"] == ["first: HTTP 503"]


async def test_a_call_whose_record_is_refused_stops_the_gateway(tmp_path: Path, server: FakeModelServer) -> None:
    recorded: list[CallRecord] = []

    async def on_call(record: CallRecord) -> bool:
        recorded.append(record)
        return False  # the fenced write was refused: a later attempt has taken over

    tc = transport(("p", server.base_url, ["chat"]))
    async for gw, client in gateway(tmp_path, tc, on_call=on_call):
        assert (await client.call("chat", body("chat"))).status_code == 200
        assert gw.stopped.is_set() and gw.stop_kind == "superseded"
        assert (await client.call("chat", body("chat"))).status_code == 403
    assert len(recorded) == 1 and recorded[0].input_tokens == 100 and len(server.model_calls) == 1


async def test_replay_answers_from_the_transcript_and_says_where_the_agent_diverged(
    tmp_path: Path, server: FakeModelServer
) -> None:
    server.script(Turn.call("bash", {"command": "ls"}), Turn.say("done"))
    tc = transport(("p", server.base_url, ["chat", "messages"]))
    async for gw, client in gateway(tmp_path, tc):
        first = await client.call("chat", body("chat", stream=True))
        second = await client.call("messages", body("messages"))
        transcript = gw.transcript_bytes()
    calls = len(server.requests)
    _head, exchanges = parse(transcript)
    replayer = Replayer(exchanges)
    async for _gw, client in gateway(tmp_path / "replay", tc, upstream=replayer):
        again = await client.call("chat", body("chat", stream=True))
        changed = body("messages")
        changed["messages"][0]["content"] = "something else"
        other = await client.call("messages", changed)
        extra = await client.call("chat", body("chat"))
    assert len(server.requests) == calls, "a replay calls no provider"
    assert again.content == first.content and other.json() == second.json()
    assert extra.status_code == 400
    [diverged, more] = replayer.divergences
    assert diverged.call == 2 and "/messages/0/content" in diverged.detail and "something else" in diverged.detail
    assert more.call == 3 and "more calls" in more.detail


async def test_the_transcript_stops_growing_at_its_bound_and_says_so(tmp_path: Path, server: FakeModelServer) -> None:
    server.script(*[Turn.say("w" * 2000)] * 6)
    tc = transport(("p", server.base_url, ["chat"]))
    async for gw, client in gateway(tmp_path, tc, max_transcript_bytes=8000):
        for _ in range(6):
            assert (await client.call("chat", body("chat"))).status_code == 200
        data = gw.transcript_bytes()
    head, exchanges = parse(data)
    assert head["truncated"] is True and head["calls"] == 6 and len(data) < 8000 + 64 * 1024
    assert exchanges[-1].get("bodies_cut") and exchanges[-1]["usage"]["input_tokens"] == 100


async def test_an_agent_that_leaves_mid_stream_frees_its_call_slot(tmp_path: Path, server: FakeModelServer) -> None:
    server.script(Turn.say("v" * 4000), Turn.say("next"))
    tc = transport(("p", server.base_url, ["chat"]))
    async for gw, client in gateway(tmp_path, tc):
        auth = {"authorization": f"Bearer {client.token}"}
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(gw.handle.socket_path))) as leaver:
            async with leaver.stream(
                "POST", "http://gw" + PATHS["chat"], json=body("chat", stream=True), headers=auth
            ) as r:
                async for _chunk in r.aiter_raw():
                    break  # gone after the first bytes
        # One call at a time: had the first kept its slot, this one would wait forever (the client's timeout says so).
        assert (await client.call("chat", body("chat"))).status_code == 200
    assert len(server.model_calls) == 2
