"""Anthropic Messages (`POST /v1/messages`): Claude Code. The credential goes upstream as `x-api-key`; usage comes in
two parts of a stream (input tokens in `message_start`, output tokens in the last `message_delta`)."""

from __future__ import annotations

from typing import Any, ClassVar

from crewwork.gateway.dialect import Dialect, StreamUsage, Usage, as_int

_ANTHROPIC_TYPES = {
    "budget": "permission_error",
    "not_allowed": "permission_error",
    "rate_limit": "rate_limit_error",
    "auth": "authentication_error",
    "too_large": "request_too_large",
    "upstream": "api_error",
}


class AnthropicMessages(Dialect):
    name: ClassVar[str] = "messages"
    path: ClassVar[str] = "/messages"

    def auth_headers(self, key: str | None) -> dict[str, str]:
        return {"x-api-key": key} if key else {}

    def usage_of(self, body: Any) -> Usage | None:
        return _usage(body.get("usage") if isinstance(body, dict) else None)

    def stream_reader(self) -> StreamUsage:
        return _MessagesStream()

    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(kind, "invalid_request_error"), "message": message},
        }


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    cached = as_int(usage.get("cache_read_input_tokens")) + as_int(usage.get("cache_creation_input_tokens"))
    return Usage(as_int(usage.get("input_tokens")) + cached, as_int(usage.get("output_tokens")), True)


class _MessagesStream(StreamUsage):
    marks = (b'"usage"', b"message_start", b"message_delta")

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            found = _usage(message.get("usage") if isinstance(message, dict) else None)
            if found is not None:
                self.usage = found
        elif kind == "message_delta":
            usage = event.get("usage")
            if isinstance(usage, dict):
                base = self.usage or Usage(reported=True)
                if "input_tokens" in usage:
                    base.input_tokens = as_int(usage.get("input_tokens"))
                base.output_tokens = as_int(usage.get("output_tokens"))
                base.reported = True
                self.usage = base
