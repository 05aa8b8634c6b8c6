"""OpenAI Chat Completions (`POST /v1/chat/completions`): mini-swe-agent (through litellm), aider, the model agent."""

from __future__ import annotations

from typing import Any, ClassVar

from crewwork.gateway.dialect import Dialect, StreamUsage, Usage, as_int


class OpenAIChat(Dialect):
    name: ClassVar[str] = "chat"
    path: ClassVar[str] = "/chat/completions"

    def upstream_body(self, request: dict[str, Any], model: str) -> dict[str, Any]:
        body = {**request, "model": model}
        if self.streaming(request):
            # A stream reports usage only when asked; the gateway asks, so every streamed call is accounted.
            options = request.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return body

    def usage_of(self, body: Any) -> Usage | None:
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        return Usage(as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens")), True)

    def stream_reader(self) -> StreamUsage:
        return _ChatStream()


class _ChatStream(StreamUsage):
    def on_event(self, event: dict[str, Any]) -> None:
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens")), True)
