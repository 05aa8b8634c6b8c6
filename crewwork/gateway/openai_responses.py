"""OpenAI Responses (`POST /v1/responses`): Codex CLI."""

from __future__ import annotations

from typing import Any, ClassVar

from crewwork.gateway.dialect import Dialect, StreamUsage, Usage, as_int


class OpenAIResponses(Dialect):
    name: ClassVar[str] = "responses"
    path: ClassVar[str] = "/responses"

    def usage_of(self, body: Any) -> Usage | None:
        return _usage(body.get("usage") if isinstance(body, dict) else None)

    def stream_reader(self) -> StreamUsage:
        return _ResponsesStream()


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    return Usage(as_int(usage.get("input_tokens")), as_int(usage.get("output_tokens")), True)


class _ResponsesStream(StreamUsage):
    def on_event(self, event: dict[str, Any]) -> None:
        kind = str(event.get("type") or "")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            found = _usage(response.get("usage") if isinstance(response, dict) else None)
            if found is not None:
                self.usage = found
