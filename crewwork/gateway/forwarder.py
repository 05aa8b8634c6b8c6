"""`AttemptGateway`: one attempt's model gateway, on the agent pool's host.

    agent (sandbox) --HTTP--> 127.0.0.1:PORT (inner_relay) --unix socket--> AttemptGateway --HTTPS--> endpoint

What it does with each request, in order:

1. **Token.** The request must carry the attempt's token (`Authorization: Bearer`, `x-api-key` or `api-key`): 32
   random bytes made for this attempt, accepted only on this attempt's socket, and worthless once the attempt ends
   (the socket is gone and the token forgotten). It is all the sandbox holds; provider keys never leave the host.
2. **Protocol.** The path names the protocol (`.../chat/completions`, `.../responses`, `.../messages`); anything else is
   a 404. `GET .../models` lists the route's models; `POST .../messages/count_tokens` is answered here (an estimate).
3. **Stop, rate, budget.** Once the attempt is stopped (budget spent, superseded, ended) every call is refused in the
   protocol's own error shape. The tenant's call rate may refuse it (429, Retry-After). Calls then take a slot
   (`max_concurrent_calls`) and the ledger is asked again under it: a spent budget refuses the call and stops the
   attempt.
4. **Route.** Only the operator's endpoints on this attempt's route that speak the request's protocol are ever
   called; the request's model picks among them (an endpoint's name or model), else the route's order holds. The
   upstream gets the endpoint's model name, its credential (from the worker's environment, added here) and a fixed set
   of protocol headers; nothing else the agent sent. A retryable failure before any byte is answered (connection,
   timeout, 408/409/429/5xx) fails over to the next endpoint.
5. **Bounds and accounting.** The answer is passed back as it arrives (streams chunk by chunk), cut at
   `max_response_bytes` or `max_call_s`. Its usage (from the body or the stream; estimated from sizes when the
   provider reports none) is charged to the ledger, the exchange goes into the transcript, and `on_call` makes it
   durable (a fenced event of the attempt): a refused write means a later attempt has taken over, and this one stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import secrets
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from crewwork.boundary.masking import Redactor
from crewwork.config.gateway import GatewaySettings
from crewwork.gateway.anthropic_messages import AnthropicMessages
from crewwork.gateway.dialect import BadRequest, Dialect, Usage
from crewwork.gateway.exchanges import Transcript, request_key
from crewwork.gateway.httpd import Request, Response, ServerBounds, UnixHttpServer
from crewwork.gateway.inner_relay import RELAY
from crewwork.gateway.ledger import TENANT_RATE, Budget, Ledger
from crewwork.gateway.openai_chat import OpenAIChat
from crewwork.gateway.openai_responses import OpenAIResponses
from crewwork.gateway.upstream import HttpUpstream, KeyMissing, Upstream, UpstreamReply, read_bounded
from crewwork.observability import tracing
from crewwork.transport.config import EndpointConfig, TransportConfig

DIALECTS: dict[str, Dialect] = {d.name: d for d in (OpenAIChat(), OpenAIResponses(), AnthropicMessages())}
INSIDE = "/crewwork/gateway"
"""Where the sandbox sees the gateway's directory (its socket and the relay program), read-only."""
SOCKET = "gw.sock"
RELAY_FILE = "relay.py"
RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
TOKEN_PREFIX = "cwgw-"


@dataclass(frozen=True)
class GatewayHandle:
    """What an agent needs to reach its gateway (plain data: it crosses into the agent's child process)."""

    host_dir: str
    """The gateway's directory on the host: mounted read-only at INSIDE."""
    token: str
    port: int
    models: tuple[tuple[str, str], ...] = ()
    """(protocol, model) of the route's first endpoint speaking each protocol: what a CLI is told to ask for."""

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL inside the sandbox (`.../v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """Without the version (Anthropic's clients add `/v1` themselves)."""
        return f"http://127.0.0.1:{self.port}"

    def relay_argv(self, argv: list[str], inside: str = INSIDE, python: str = "python3") -> list[str]:
        """`argv` started behind the relay (the sandbox's first process)."""
        return [python, f"{inside}/{RELAY_FILE}", f"{inside}/{SOCKET}", str(self.port), "--", *argv]

    @property
    def socket_path(self) -> Path:
        return Path(self.host_dir) / SOCKET


@dataclass(frozen=True)
class CallRecord:
    """One finished call, as the attempt's durable record holds it."""

    n: int
    dialect: str
    endpoint: str | None
    model: str | None
    status: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    estimated: bool
    duration_s: float
    refused: str | None = None

    def event(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class AttemptGateway:
    """One attempt's gateway. `async with AttemptGateway(...) as gw:` hand `gw.handle` to the agent; `gw.stopped` is
    set (with `gw.stop_reason`) when the attempt must end; `gw.transcript_bytes()` is the transcript artifact."""

    def __init__(
        self,
        *,
        root: Path,
        transport: TransportConfig,
        route: list[str],
        settings: GatewaySettings,
        budget: Budget,
        tenant_id: str,
        header: dict[str, Any],
        env: Mapping[str, str] | None = None,
        upstream: Upstream | None = None,
        on_call: Callable[[CallRecord], Awaitable[bool]] | None = None,
        calls_per_minute: float | None = None,
        max_transcript_bytes: int | None = None,
    ) -> None:
        self.dir = root / f"gw-{uuid.uuid4().hex[:12]}"
        self.transport = transport
        self.route = [n for n in route if n in transport.endpoints]
        self.settings = settings
        self.ledger = Ledger(budget)
        self.tenant_id = tenant_id
        self.env = os.environ if env is None else env
        self.upstream: Upstream = upstream or HttpUpstream(self.env)
        self.on_call = on_call
        self.per_minute = settings.calls_per_minute if calls_per_minute is None else calls_per_minute
        self.token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        keys = [self.env.get(e.api_key_env, "") for e in transport.endpoints.values() if e.api_key_env]
        self.redact = Redactor([*keys, self.token])
        route_info = [
            {"endpoint": n, "base_url": transport.endpoints[n].base_url, "model": transport.endpoints[n].model,
             "protocols": list(transport.endpoints[n].protocols)}
            for n in self.route
        ]  # fmt: skip
        self.transcript = Transcript(
            {**header, "route": route_info},
            self.redact,
            min(settings.max_transcript_bytes, max_transcript_bytes or settings.max_transcript_bytes),
            settings.max_exchange_bytes,
        )
        self.stopped = asyncio.Event()
        self.stop_reason: str | None = None
        self.stop_kind: str | None = None
        self.refused = 0
        self._slots = asyncio.Semaphore(settings.max_concurrent_calls)
        self._server: UnixHttpServer | None = None
        self._started = time.time()
        # The attempt's trace (the gateway is opened inside its activity): each call upstream is a span of it, and
        # the provider gets its traceparent, whatever the agent sent (its headers are never passed on).
        self.traceparent = tracing.current_traceparent()

    # ------------------------------------------------------------------ lifecycle

    @property
    def handle(self) -> GatewayHandle:
        models: dict[str, str] = {}
        for n in self.route:
            for p in self.transport.endpoints[n].protocols:
                models.setdefault(p, self.transport.endpoints[n].model)
        return GatewayHandle(str(self.dir), self.token, self.settings.port, tuple(models.items()))

    async def __aenter__(self) -> AttemptGateway:
        self.dir.mkdir(parents=True, mode=0o755)
        self.dir.chmod(0o755)  # the sandbox's user reads the relay and connects to the socket; it never writes here
        (self.dir / RELAY_FILE).write_text(RELAY)
        (self.dir / RELAY_FILE).chmod(0o644)
        bounds = ServerBounds(
            max_body_bytes=self.settings.max_request_bytes, read_timeout_s=self.settings.request_timeout_s
        )
        self._server = UnixHttpServer(self.dir / SOCKET, self._handle, bounds)
        try:
            await self._server.__aenter__()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop("ended", "the attempt has ended")
        self.token = ""  # revoked: nothing can match it any more
        if self._server is not None:
            await self._server.__aexit__()
        with contextlib.suppress(Exception):
            await self.upstream.aclose()
        shutil.rmtree(self.dir, ignore_errors=True)

    def stop(self, kind: str, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_kind, self.stop_reason = kind, reason
        self.stopped.set()

    def summary(self) -> dict[str, Any]:
        return {
            "tokens": self.ledger.tokens,
            "cost_usd": round(self.ledger.cost_usd, 8),
            "calls_charged": self.ledger.calls,
            "refused": self.refused,
            "stopped": self.stop_reason if self.stop_kind not in (None, "ended") else None,
        }

    def transcript_bytes(self) -> bytes:
        return self.transcript.render(self.summary())

    # ------------------------------------------------------------------ one request

    async def _handle(self, req: Request) -> Response:
        dialect, tail = _dialect_of(req.path)
        shape = dialect or DIALECTS["chat"]
        if not self._authorized(req):
            return _refusal(shape, 401, "auth", "this gateway accepts only the attempt's own token")
        if req.method == "GET" and tail == "/models":
            models = [{"id": self.transport.endpoints[n].model, "object": "model"} for n in self.route]
            return Response.json(200, {"object": "list", "data": models})
        if req.method == "POST" and tail == "/messages/count_tokens":
            return Response.json(200, {"input_tokens": max(1, len(req.body) // 4)})
        if dialect is None or req.method != "POST":
            return _refusal(shape, 404, "not_found", f"the gateway serves no {req.method} {req.path}")
        try:
            request = dialect.parse(req.body)
        except BadRequest as e:
            return _refusal(dialect, 400, "bad_request", str(e))
        if self.stopped.is_set():
            return self._refuse(dialect, request, self.stop_kind or "ended", self.stop_reason or "stopped")
        wait = TENANT_RATE.take(self.tenant_id, self.per_minute)
        if wait > 0:
            response = _refusal(dialect, 429, "rate_limit", f"the tenant's model call rate ({self.per_minute:g}/min)")
            response.headers["retry-after"] = str(max(1, int(wait + 0.999)))
            return response
        candidates = self._candidates(dialect, str(request["model"]))
        if not candidates:
            return _refusal(
                dialect, 400, "not_allowed",
                f"no endpoint on this attempt's route speaks the {dialect.name!r} protocol; the operator's route: "
                f"{', '.join(self.route) or 'none'}",
            )  # fmt: skip
        await self._slots.acquire()
        released = False
        try:
            why = self.ledger.exhausted()
            if why is not None or self.stopped.is_set():
                self.stop("budget", why) if why else None
                return self._refuse(dialect, request, self.stop_kind or "budget", self.stop_reason or str(why))
            response = await self._forward(dialect, request, req, candidates)
            released = response.stream is not None  # the stream releases the slot when it ends
            return response
        finally:
            if not released:
                self._slots.release()

    def _authorized(self, req: Request) -> bool:
        if not self.token:
            return False
        offered = req.headers.get("x-api-key") or req.headers.get("api-key") or ""
        auth = req.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            offered = auth[7:].strip()
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def _candidates(self, dialect: Dialect, model: str) -> list[str]:
        speaking = [n for n in self.route if dialect.name in self.transport.endpoints[n].protocols]
        named = [n for n in speaking if model in (n, self.transport.endpoints[n].model)]
        return named + [n for n in speaking if n not in named]

    def _refuse(self, dialect: Dialect, request: dict[str, Any], kind: str, reason: str) -> Response:
        self.refused += 1
        self.transcript.add(
            {"dialect": dialect.name, "request_key": request_key(request), "refused": reason, "status": 429
             if kind == "budget" and dialect.name != "messages" else 403, "at": round(time.time() - self._started, 3)}
        )  # fmt: skip
        status = 429 if kind == "budget" and dialect.name != "messages" else 403
        message = f"crewwork gateway: {reason}; the attempt is ending"
        return _refusal(dialect, status, "budget" if kind == "budget" else "not_allowed", message)

    async def _forward(
        self, dialect: Dialect, request: dict[str, Any], req: Request, candidates: list[str]
    ) -> Response:
        started = time.monotonic()
        failovers: list[str] = []
        for i, name in enumerate(candidates):
            endpoint = self.transport.endpoints[name]
            body = dialect.upstream_body(request, endpoint.model)
            last = i == len(candidates) - 1
            try:
                with tracing.span(
                    "gateway.call",
                    traceparent=self.traceparent,
                    attributes={"crewwork.endpoint": name, "crewwork.protocol": dialect.name},
                ):
                    reply = await asyncio.wait_for(
                        self.upstream.open(dialect, name, endpoint, body, req), endpoint.read_timeout_s + 5
                    )
            except KeyMissing as e:
                return await self._failed(dialect, request, name, 502, str(e), started, failovers)
            except (httpx.HTTPError, OSError, TimeoutError) as e:
                failovers.append(self.redact(f"{name}: {type(e).__name__}: {e}"))
                if last:
                    return await self._failed(dialect, request, name, 502, failovers[-1], started, failovers)
                continue
            if reply.status != 200:
                data = await read_bounded(reply, 64 * 1024)
                await reply.close()
                text = self.redact(data.decode("utf-8", "replace"))
                if reply.status in RETRYABLE and not last:
                    failovers.append(f"{name}: HTTP {reply.status}")
                    continue
                return await self._failed(
                    dialect, request, name, reply.status, text, started, failovers, passthrough=text,
                    headers={k: v for k, v in reply.headers.items() if k.lower() in ("retry-after", "retry-after-ms")},
                )  # fmt: skip
            if dialect.streaming(request):
                return self._streamed(dialect, request, name, endpoint, reply, started, failovers)
            return await self._whole(dialect, request, name, endpoint, reply, started, failovers)
        raise AssertionError("no candidates")  # _handle checked

    async def _whole(
        self,
        dialect: Dialect,
        request: dict[str, Any],
        name: str,
        endpoint: EndpointConfig,
        reply: UpstreamReply,
        started: float,
        failovers: list[str],
    ) -> Response:
        limit = self.settings.max_response_bytes
        cut: str | None
        try:
            data = await asyncio.wait_for(read_bounded(reply, limit + 1), self.settings.max_call_s)
        except TimeoutError:
            data, cut = b"", "the call took longer than max_call_s"
        else:
            cut = "the answer is larger than max_response_bytes" if len(data) > limit else None
        finally:
            await reply.close()
        if cut:
            await self._account(dialect, request, name, endpoint, 502, None, 0, started, failovers, cut=cut)
            return _refusal(dialect, 502, "upstream", f"crewwork gateway: {cut}")
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
        usage = dialect.usage_of(parsed) if parsed is not None else None
        await self._account(
            dialect, request, name, endpoint, 200, usage, len(data), started, failovers, response=parsed
            if parsed is not None else data.decode("utf-8", "replace"),
        )  # fmt: skip
        return Response(200, {"content-type": reply.headers.get("content-type", "application/json")}, data)

    def _streamed(
        self,
        dialect: Dialect,
        request: dict[str, Any],
        name: str,
        endpoint: EndpointConfig,
        reply: UpstreamReply,
        started: float,
        failovers: list[str],
    ) -> Response:
        reader = dialect.stream_reader()
        keep = self.settings.max_exchange_bytes
        limit = self.settings.max_response_bytes
        deadline = started + self.settings.max_call_s

        begun = [False]

        async def never_begun() -> None:
            if not begun[0]:  # the client went before the stream started: free the slot, close the upstream
                with contextlib.suppress(Exception):
                    await reply.close()
                self._slots.release()

        async def relay() -> AsyncIterator[bytes]:
            begun[0] = True
            kept = bytearray()
            size, cut, first = 0, None, None
            try:
                # The deadline is checked at every chunk (no timer per chunk: a stream is hundreds of small ones);
                # a silent upstream is cut by the endpoint's read timeout between two chunks.
                async for chunk in reply.chunks():
                    now = time.monotonic()
                    if first is None:
                        first = now - started
                    size += len(chunk)
                    if size > limit:
                        cut = "the stream is longer than max_response_bytes"
                        break
                    if now > deadline:
                        cut = "the call took longer than max_call_s"
                        break
                    reader.feed(chunk)
                    if len(kept) < keep:
                        kept += chunk[: keep - len(kept)]
                    yield chunk
            except httpx.TimeoutException:
                cut = "the upstream went silent for longer than the endpoint's read_timeout_s"
            except (httpx.HTTPError, OSError) as e:
                cut = f"the upstream stream broke: {type(e).__name__}"
            finally:
                with contextlib.suppress(Exception):
                    await reply.close()
                try:
                    await asyncio.shield(
                        self._account(
                            dialect, request, name, endpoint, 200, reader.usage, size, started, failovers,
                            response_sse=kept.decode("utf-8", "replace"), cut=cut, ttfb=first,
                            output_chars=reader.output_chars,
                        )
                    )  # fmt: skip
                finally:
                    self._slots.release()

        headers = {"content-type": "text/event-stream", "cache-control": "no-cache"}
        return Response(200, headers, stream=relay(), on_close=never_begun)

    async def _failed(
        self,
        dialect: Dialect,
        request: dict[str, Any],
        name: str,
        status: int,
        message: str,
        started: float,
        failovers: list[str],
        *,
        passthrough: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        endpoint = self.transport.endpoints[name]
        await self._account(dialect, request, name, endpoint, status, None, 0, started, failovers, error=message)
        if passthrough is not None:
            return Response(status, {"content-type": "application/json", **(headers or {})}, passthrough.encode())
        return _refusal(dialect, status, "upstream", f"crewwork gateway: {message}")

    async def _account(
        self,
        dialect: Dialect,
        request: dict[str, Any],
        name: str,
        endpoint: EndpointConfig,
        status: int,
        usage: Usage | None,
        answered_bytes: int,
        started: float,
        failovers: list[str],
        *,
        response: Any = None,
        response_sse: str | None = None,
        cut: str | None = None,
        error: str | None = None,
        ttfb: float | None = None,
        output_chars: int = 0,
    ) -> None:
        duration = time.monotonic() - started
        if usage is None and status == 200:
            # The provider reported nothing: charge an estimate rather than nothing, and say so.
            usage = Usage(len(json.dumps(request)) // 4, output_chars or answered_bytes // 8, False)
        usage = usage or Usage()
        cost = endpoint.cost_usd(usage.input_tokens, usage.output_tokens)
        self.ledger.charge(usage.total, cost)
        self.transcript.add(
            {
                "dialect": dialect.name,
                "at": round(time.time() - self._started, 3),
                "endpoint": name,
                "model": endpoint.model,
                "requested_model": request.get("model"),
                "stream": dialect.streaming(request),
                "status": status,
                "request_key": request_key(request),
                "request": request,
                "response": response,
                "response_sse": response_sse,
                "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                          "reported": usage.reported},
                "cost_usd": round(cost, 8),
                "duration_s": round(duration, 4),
                "ttfb_s": round(ttfb, 4) if ttfb is not None else None,
                "failovers": failovers or None,
                "cut": cut,
                "error": error,
            }
        )  # fmt: skip
        record = CallRecord(
            n=self.transcript.calls,
            dialect=dialect.name,
            endpoint=name,
            model=endpoint.model,
            status=status,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=round(cost, 8),
            estimated=not usage.reported,
            duration_s=round(duration, 4),
        )
        if self.on_call is not None:
            try:
                current = await self.on_call(record)
            except Exception as exc:  # the store is unreachable: no further call may go unrecorded
                self.stop("unrecorded", f"a model call could not be recorded ({type(exc).__name__}); stopping")
                return
            if not current:
                self.stop("superseded", "a later attempt of this step has taken over")
        why = self.ledger.exhausted()
        if why is not None:
            # This call is answered (it was paid for); the next one is refused.
            self.stop_kind, self.stop_reason = self.stop_kind or "budget", self.stop_reason or why


def _dialect_of(path: str) -> tuple[Dialect | None, str]:
    p = path.rstrip("/")
    for prefix in ("/v1", "/openai/v1", "/anthropic/v1"):
        if p.startswith(prefix + "/"):
            p = p[len(prefix) :]
            break
    for d in DIALECTS.values():
        if p == d.path:
            return d, p
    return None, p


def _refusal(dialect: Dialect, status: int, kind: str, message: str) -> Response:
    return Response.json(status, dialect.error_body(status, message, kind))
