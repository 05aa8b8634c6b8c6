"""What the model protocols share, and the one place a protocol's differences are declared (`Dialect`).

A dialect knows its request path, how a request names its model and asks for a stream, how its responses report
usage (in a JSON body, or spread over the events of a server-sent stream), how an upstream wants its credential, and
what an error looks like to a client of that protocol, so that a call the gateway refuses reaches the agent CLI in a
shape it understands. Each protocol is a subclass in a module of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

MAX_SSE_LINE = 4 * 1024 * 1024
"""Longest line of a server-sent stream the usage reader looks at (a longer one is passed on, not parsed)."""


@dataclass
class Usage:
    """Tokens of one call, as the provider reported them (or estimated, when it reported none)."""

    input_tokens: int = 0
    output_tokens: int = 0
    reported: bool = False
    """False: the provider said nothing about usage and the figures are estimates (bytes / 4)."""

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class BadRequest(ValueError):
    """A request the gateway will not forward; the message is for the agent."""


class Dialect:
    """One protocol. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    """`chat`, `responses` or `messages`: what an endpoint's `protocols` lists."""
    path: ClassVar[str]
    """The request path below the API version (`/chat/completions`, ...)."""

    def parse(self, body: bytes) -> dict[str, Any]:
        """The request as an object; BadRequest when it is not one, or names no model."""
        try:
            data = json.loads(body)
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(data, dict):
            raise BadRequest("the request body must be a JSON object")
        if not isinstance(data.get("model"), str) or not data["model"]:
            raise BadRequest("the request names no model")
        return data

    def streaming(self, request: dict[str, Any]) -> bool:
        return bool(request.get("stream"))

    def upstream_body(self, request: dict[str, Any], model: str) -> dict[str, Any]:
        """What is sent upstream: the request with the endpoint's model name."""
        return {**request, "model": model}

    def auth_headers(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def usage_of(self, body: Any) -> Usage | None:
        """Usage from a whole (non-streamed) response body."""
        raise NotImplementedError

    def stream_reader(self) -> StreamUsage:
        raise NotImplementedError

    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        """An error in this protocol's shape. `kind`: budget, rate_limit, bad_request, not_allowed, upstream,
        too_large, auth."""
        return {"error": {"message": message, "type": _OPENAI_TYPES.get(kind, "invalid_request_error"), "code": kind}}


_OPENAI_TYPES = {
    "budget": "insufficient_quota",
    "rate_limit": "rate_limit_exceeded",
    "auth": "invalid_api_key",
    "upstream": "server_error",
}


class StreamUsage:
    """Reads usage from a server-sent event stream as its bytes pass through (the stream itself is passed on as it
    came). Subclasses look at the data of the events that contain one of their `marks`."""

    marks: tuple[bytes, ...] = (b'"usage"',)

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.output_chars = 0
        self._buf = b""

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        while True:
            cut = self._buf.find(b"\n")
            if cut < 0:
                if len(self._buf) > MAX_SSE_LINE:
                    self._buf = b""  # one enormous line: not parsed, still passed on
                return
            line, self._buf = self._buf[:cut].rstrip(b"\r"), self._buf[cut + 1 :]
            if line.startswith(b"data:"):
                data = line[5:].strip()
                self.output_chars += len(data) // 4  # a rough size of what was said, for an estimate only
                # Only the events that carry usage are parsed: the rest pass through untouched (and cheaply).
                if data and data != b"[DONE]" and any(mark in data for mark in self.marks):
                    try:
                        event = json.loads(data)
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        self.on_event(event)

    def on_event(self, event: dict[str, Any]) -> None:
        raise NotImplementedError


def sse_events(text: str) -> Iterator[dict[str, Any]]:
    """The JSON `data:` payloads of a recorded stream (replay and tests)."""
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield event


def as_int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0
