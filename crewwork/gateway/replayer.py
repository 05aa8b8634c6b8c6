"""Answering an attempt's model calls from its recorded transcript instead of a provider: replay.

The replayed agent runs for real (its CLI, in a fresh sandbox, on the same base commit); only the model is replaced.
Each call is answered with a recorded answer of the same protocol: the first unused one whose request was exactly the
same (the same `request_key`), else the next unused one in recorded order, and that call is a *divergence* (the agent
asked something it did not ask the first time; the report says which call and what differed). When no recorded answer
is left, the call is refused (the agent asked more than it did the first time). No provider is ever called.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from crewwork.gateway.dialect import Dialect
from crewwork.gateway.exchanges import asked_key, comparable, request_key, without_tool_output
from crewwork.gateway.httpd import Request
from crewwork.gateway.upstream import UpstreamReply
from crewwork.transport.config import EndpointConfig


@dataclass
class _Recorded:
    code: int
    data: bytes
    content_type: str

    @property
    def status(self) -> int:
        return self.code

    @property
    def headers(self) -> Mapping[str, str]:
        return {"content-type": self.content_type}

    async def _iter(self) -> AsyncIterator[bytes]:
        step = 16 * 1024
        for i in range(0, len(self.data), step):
            yield self.data[i : i + step]

    def chunks(self) -> AsyncIterator[bytes]:
        return self._iter()

    async def close(self) -> None:
        return None


@dataclass
class Divergence:
    call: int
    """The replayed call's number (1-based, among the calls of its protocol)."""
    dialect: str
    detail: str


@dataclass
class Replayer:
    """An `Upstream` over a transcript's exchanges."""

    exchanges: list[dict[str, Any]]
    used: set[int] = field(default_factory=set)
    calls: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    """Calls where the agent asked something else than it did (tools' output left out of the comparison)."""
    observations: list[Divergence] = field(default_factory=list)
    """Calls where only what the agent's tools printed differed (a clock, a random id, a listing)."""
    unanswerable: int = 0

    @property
    def recorded_calls(self) -> int:
        return sum(1 for e in self.exchanges if _answerable(e))

    async def open(
        self, dialect: Dialect, endpoint_name: str, endpoint: EndpointConfig, body: dict[str, Any], request: Request
    ) -> UpstreamReply:
        self.calls += 1
        asked = json.loads(request.body)
        key = request_key(asked)
        mine = [i for i, e in enumerate(self.exchanges) if e.get("dialect") == dialect.name and _answerable(e)]
        free = [i for i in mine if i not in self.used]
        same = [i for i in free if self.exchanges[i].get("request_key") == key]
        asked_same = [i for i in free if _asked(self.exchanges[i]) == asked_key(asked)]
        if same:
            pick = same[0]
        elif asked_same:
            pick = asked_same[0]
            self.observations.append(Divergence(self.calls, dialect.name, _difference(self.exchanges[pick], asked)))
        elif free:
            pick = free[0]
            detail = _difference(self.exchanges[pick], asked, tools=False)
            self.divergences.append(Divergence(self.calls, dialect.name, detail))
        else:
            self.unanswerable += 1
            self.divergences.append(Divergence(self.calls, dialect.name, "the agent made more calls than recorded"))
            message = {"error": {"message": "replay: no recorded answer left for this call", "type": "replay"}}
            return _Recorded(400, json.dumps(message).encode(), "application/json")
        self.used.add(pick)
        e = self.exchanges[pick]
        if e.get("response_sse") is not None:
            return _Recorded(200, str(e["response_sse"]).encode(), "text/event-stream")
        response = e.get("response")
        data = response.encode() if isinstance(response, str) else json.dumps(response).encode()
        return _Recorded(200, data, "application/json")

    async def aclose(self) -> None:
        return None


def _answerable(e: dict[str, Any]) -> bool:
    return e.get("status") == 200 and (e.get("response") is not None or e.get("response_sse") is not None)


def _asked(e: dict[str, Any]) -> str | None:
    request = e.get("request")
    return asked_key(request) if isinstance(request, dict) else None


def _difference(recorded: dict[str, Any], asked: dict[str, Any], *, tools: bool = True) -> str:
    """Where the replayed request first differs from the recorded one (a short path and the two values); with
    `tools` false, what the tools printed is left out of the comparison."""
    before = recorded.get("request")
    if not isinstance(before, dict):
        return "the recorded request's body was not kept (transcript bound)"
    a, b = comparable(before), comparable(asked)
    if not tools:
        a, b = without_tool_output(a), without_tool_output(b)
    path = _first_difference(a, b, "")
    was, now = _at(a, path or ""), _at(b, path or "")
    if isinstance(was, str) and isinstance(now, str):
        i = next((k for k, (x, y) in enumerate(zip(was, now, strict=False)) if x != y), min(len(was), len(now)))
        lo = max(0, i - 30)
        return f"the request differs at {path}: recorded {was[lo : i + 40]!r}, replayed {now[lo : i + 40]!r}"
    return f"the request differs at {path or 'the top level'}"


def _at(value: Any, path: str) -> Any:
    for part in [p for p in path.split(" ")[0].split("/") if p]:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _first_difference(a: Any, b: Any, path: str) -> str | None:
    if type(a) is not type(b):
        return path or "/"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}"
            found = _first_difference(a[k], b[k], f"{path}/{k}")
            if found is not None:
                return found
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = _first_difference(x, y, f"{path}/{i}")
            if found is not None:
                return found
        return None if len(a) == len(b) else f"{path} (length {len(a)} then {len(b)})"
    return None if a == b else path or "/"
