"""An async client for the OpenAI chat-completions protocol, with routing, fallback and accounting.

``ModelClient.complete(workload, messages)`` posts to ``{base_url}/chat/completions`` of each endpoint on the
workload's route in order and returns the first success with its token usage and cost.

No client-side retries: httpx is built with ``retries=0`` and no endpoint is called twice for one
``complete``. Temporal's activity retry policy is the only retry loop, so attempts, backoff and the final
"dead" state stay visible in one place.

Fallback rule: a *retryable* failure (429, 5xx, 408, 409, timeout, connection refused, garbled response) on an
endpoint moves on to the next endpoint of the route in the same call — that is routing around an outage, not
retrying it. When every endpoint failed retryably, `ProviderUnavailable` is raised with the soonest
``Retry-After`` any of them gave (None when any endpoint gave no hint, so Temporal's own backoff applies).
A *non-retryable* failure (401, 403, 404, 400, ...) stops at once: a bad key or an unknown model is a
configuration error the operator must see, not something to paper over with another provider.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from crewwork.boundary.masking import Redactor
from crewwork.observability import tracing
from crewwork.transport.config import EndpointConfig, TransportConfig
from crewwork.transport.errors import (
    ProviderRejected,
    ProviderUnavailable,
    cause_hint,
    is_retryable_status,
    parse_retry_after,
    provider_message,
    rejected_cause,
)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ChatResult:
    """One successful completion."""

    content: str
    endpoint: str
    model: str
    usage: Usage
    cost_usd: float
    finish_reason: str | None = None
    failovers: list[str] = field(default_factory=list)
    """Redacted one-line reasons for endpoints skipped before this one answered."""

    def to_record(self) -> dict[str, Any]:
        """JSON-safe form, used in heartbeat details and transcripts."""
        return {
            "content": self.content,
            "endpoint": self.endpoint,
            "model": self.model,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "cost_usd": self.cost_usd,
            "finish_reason": self.finish_reason,
            "failovers": list(self.failovers),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> ChatResult:
        return cls(
            content=str(rec.get("content") or ""),
            endpoint=str(rec.get("endpoint") or ""),
            model=str(rec.get("model") or ""),
            usage=Usage(int(rec.get("prompt_tokens") or 0), int(rec.get("completion_tokens") or 0)),
            cost_usd=float(rec.get("cost_usd") or 0.0),
            finish_reason=rec.get("finish_reason"),
            failovers=list(rec.get("failovers") or []),
        )


class ModelClient:
    """Routes chat completions to configured endpoints. One instance per agent run."""

    def __init__(
        self,
        config: TransportConfig,
        *,
        env: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self._env = os.environ if env is None else env
        self._transport = transport
        self.redact = Redactor.for_key_envs(config.key_env_names(), self._env)

    async def complete(
        self, workload: str, messages: list[dict[str, Any]], *, max_output_tokens: int | None = None
    ) -> ChatResult:
        failures: list[ProviderUnavailable] = []
        for name in self.config.route(workload):
            endpoint = self.config.endpoints[name]
            try:
                result = await self._call(name, endpoint, messages, max_output_tokens)
            except ProviderUnavailable as e:
                failures.append(e)
                continue
            if failures:
                result = ChatResult(**{**result.__dict__, "failovers": [str(f) for f in failures]})
            return result
        hints = [f.retry_after_s for f in failures]
        retry_after = None if any(h is None for h in hints) else min(h for h in hints if h is not None)
        if len(failures) == 1:
            raise failures[0]
        summary = "; ".join(str(f) for f in failures)
        raise ProviderUnavailable(
            f"every endpoint of route {workload!r} failed: {summary}",
            endpoint=",".join(f.endpoint for f in failures),
            cause=failures[-1].cause,
            status=failures[-1].status,
            retry_after_s=retry_after,
        )

    def _api_key(self, name: str, endpoint: EndpointConfig) -> str | None:
        if endpoint.api_key_env is None:
            return None
        key = self._env.get(endpoint.api_key_env, "").strip()
        if not key:
            raise ProviderRejected(
                f"endpoint {name!r}: environment variable {endpoint.api_key_env} is not set on the agent worker",
                endpoint=name,
                cause="auth",
            )
        return key

    async def _call(
        self,
        name: str,
        endpoint: EndpointConfig,
        messages: list[dict[str, Any]],
        max_output_tokens: int | None,
    ) -> ChatResult:
        headers = {"Content-Type": "application/json", "Accept": "application/json", **endpoint.extra_headers}
        key = self._api_key(name, endpoint)
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        body: dict[str, Any] = {**endpoint.extra_body, "model": endpoint.model, "messages": messages}
        if endpoint.temperature is not None:
            body["temperature"] = endpoint.temperature
        cap = max_output_tokens or endpoint.max_output_tokens
        if cap is not None:
            body["max_tokens"] = cap
        timeout = httpx.Timeout(
            connect=endpoint.connect_timeout_s,
            read=endpoint.read_timeout_s,
            write=endpoint.connect_timeout_s,
            pool=endpoint.connect_timeout_s,
        )
        # retries=0: no hidden retry loop under Temporal's. follow_redirects off: a redirect would resend the
        # key to wherever the server points.
        transport = self._transport or httpx.AsyncHTTPTransport(retries=0)
        transport = tracing.async_transport(transport) or transport  # a client span per call when tracing is on
        url = f"{endpoint.base_url}/chat/completions"
        try:
            client = httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False)
            async with client:
                response = await client.post(url, headers=headers, content=json.dumps(body).encode())
        except httpx.TimeoutException as e:
            raise self._unavailable(name, "timeout", f"{type(e).__name__} (configured timeout)") from None
        except httpx.TransportError as e:
            raise self._unavailable(name, "connection", f"{type(e).__name__}: {e}") from None
        if response.status_code != 200:
            self._raise_for_status(name, response)
        return self._parse(name, endpoint, response)

    def _unavailable(
        self, name: str, cause: str, detail: str, status: int | None = None, retry_after: float | None = None
    ) -> ProviderUnavailable:
        if retry_after is not None:
            retry_after = min(retry_after, self.config.max_retry_after_s)
        return ProviderUnavailable(
            self.redact(f"endpoint {name!r}: {cause}: {detail}"),
            endpoint=name,
            cause=cause,
            status=status,
            retry_after_s=retry_after,
        )

    def _raise_for_status(self, name: str, response: httpx.Response) -> None:
        status = response.status_code
        message, code = provider_message(response.content)
        if is_retryable_status(status):
            if status == 429:
                cause = "rate_limited"
            else:
                cause = "server_error" if status >= 500 else f"http_{status}"
            raise self._unavailable(
                name, cause, f"HTTP {status}: {message}", status, parse_retry_after(response.headers)
            )
        if 300 <= status < 400:
            cause, hint = "redirect", "the base URL redirects; configure the final URL (keys are not resent)"
        else:
            cause = rejected_cause(status, message, code)
            hint = cause_hint(cause)
        raise ProviderRejected(
            self.redact(f"endpoint {name!r}: HTTP {status} ({cause}: {hint}): {message}"),
            endpoint=name,
            cause=cause,
            status=status,
        )

    def _parse(self, name: str, endpoint: EndpointConfig, response: httpx.Response) -> ChatResult:
        try:
            data = response.json()
        except ValueError:
            raise self._unavailable(name, "bad_response", "response is not JSON", 200) from None
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            # Some proxies report upstream failures in a 200 body; treat like a 502.
            message, _ = provider_message(response.content)
            raise self._unavailable(name, "server_error", f"error in a 200 response: {message}", 200)
        try:
            choice = data["choices"][0]
            content = choice["message"].get("content") or ""
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise self._unavailable(name, "bad_response", "response has no choices[0].message", 200) from None
        if not isinstance(content, str):
            # A list of content parts (some servers): keep the text parts.
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        usage_raw = data.get("usage") or {}
        usage = Usage(
            prompt_tokens=int(usage_raw.get("prompt_tokens") or 0),
            completion_tokens=int(usage_raw.get("completion_tokens") or 0),
        )
        return ChatResult(
            content=content,
            endpoint=name,
            model=str(data.get("model") or endpoint.model),
            usage=usage,
            cost_usd=endpoint.cost_usd(usage.prompt_tokens, usage.completion_tokens),
            finish_reason=finish,
        )
