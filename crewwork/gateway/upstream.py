"""Where the gateway's calls go: the operator's endpoints over HTTP, with the credential added on this side.

`Upstream` is the interface (`open` one call, get its status, headers and body chunks); `HttpUpstream` calls the
endpoint; crewwork/gateway/replayer.py answers from a transcript instead.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from crewwork.gateway.dialect import Dialect
from crewwork.gateway.httpd import Request
from crewwork.observability import tracing
from crewwork.transport.config import EndpointConfig

# Request headers passed upstream as the agent sent them (protocol options); every other header is dropped.
PASSED_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta")


class UpstreamReply(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class Upstream(Protocol):
    """Where calls go: the operator's endpoints over HTTP, or (replay) a recorded transcript."""

    async def open(
        self, dialect: Dialect, endpoint_name: str, endpoint: EndpointConfig, body: dict[str, Any], request: Request
    ) -> UpstreamReply: ...

    async def aclose(self) -> None: ...


@dataclass
class _HttpReply:
    response: httpx.Response

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self.response.headers

    def chunks(self) -> AsyncIterator[bytes]:
        return self.response.aiter_raw()

    async def close(self) -> None:
        await self.response.aclose()


class HttpUpstream:
    """The operator's endpoints, with the credential added on this side (from the worker's environment)."""

    def __init__(self, env: Mapping[str, str], transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.env = env
        # retries=0 and no redirects: a redirect would carry the key wherever the server points.
        self.client = httpx.AsyncClient(
            transport=transport or httpx.AsyncHTTPTransport(retries=0), follow_redirects=False, timeout=None
        )

    async def open(
        self, dialect: Dialect, endpoint_name: str, endpoint: EndpointConfig, body: dict[str, Any], request: Request
    ) -> UpstreamReply:
        key = None
        if endpoint.api_key_env:
            key = self.env.get(endpoint.api_key_env, "").strip()
            if not key:
                raise KeyMissing(f"endpoint {endpoint_name!r}: {endpoint.api_key_env} is not set on the agent worker")
        headers = {k: v for k, v in request.headers.items() if k in PASSED_HEADERS}
        headers.setdefault("content-type", "application/json")
        if dialect.name == "messages":
            headers.setdefault("anthropic-version", "2023-06-01")
        headers.update(endpoint.extra_headers)
        headers.update(dialect.auth_headers(key))
        traceparent = tracing.current_traceparent()  # the gateway's span of this call, in the attempt's trace
        if traceparent:
            headers["traceparent"] = traceparent
        url = f"{endpoint.base_url}{dialect.path}"
        timeout = httpx.Timeout(
            connect=endpoint.connect_timeout_s,
            read=endpoint.read_timeout_s,
            write=endpoint.connect_timeout_s,
            pool=endpoint.connect_timeout_s,
        )
        req = self.client.build_request(
            "POST", url, headers=headers, content=json.dumps(body).encode(), timeout=timeout
        )
        return _HttpReply(await self.client.send(req, stream=True))

    async def aclose(self) -> None:
        await self.client.aclose()


class KeyMissing(Exception):
    """The endpoint's key variable is not set on the worker: an operator problem, said to the agent as a 502."""


async def read_bounded(reply: UpstreamReply, limit: int) -> bytes:
    """At most `limit` bytes of an upstream answer's body; the rest is never read."""
    out = bytearray()
    async for chunk in reply.chunks():
        out += chunk
        if len(out) >= limit:
            break
    return bytes(out[:limit])
