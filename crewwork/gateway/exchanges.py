"""The attempt's transcript: every exchange with the model (request, response, usage, timing), secrets masked, bounded.

One JSON object per line: a header, then one line per call in the order the calls finished. A request and a response
are kept whole up to `exchange_max_bytes` each; the transcript as a whole stops growing at `max_bytes`, after which a
call is still listed (number, endpoint, usage, timing) without its bodies, and the header's last word (`truncated`)
says so. A transcript cut that way cannot replay the calls whose bodies it lost, and replay says which.

Masking happens here, as each line is written: the provider keys of the route, the attempt's gateway token, anything
in an authorization header and the common token shapes (crewwork/boundary/masking.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from crewwork.boundary.masking import Redactor

FORMAT = "crewwork-gateway-transcript/1"


# Request fields that identify a session rather than ask anything (a replay runs a new session): left out of the
# comparison, as are UUIDs anywhere in the request (session and request ids inside prompts) and the attempt's gateway
# token (a replay has its own, which an agent may have printed).
SESSION_FIELDS = frozenset({"metadata", "prompt_cache_key", "user", "client_metadata", "safety_identifier"})
_TOKEN = re.compile(r"cwgw-[A-Za-z0-9_-]{20,}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


def comparable(request: Any) -> Any:
    """What the agent asked, without what only names its session (for replay's comparison)."""
    if isinstance(request, dict):
        return {k: comparable(v) for k, v in request.items() if k not in SESSION_FIELDS}
    if isinstance(request, list):
        return [comparable(v) for v in request]
    if isinstance(request, str):
        return _TOKEN.sub("<token>", _UUID.sub("<uuid>", request))
    return request


def without_tool_output(request: Any) -> Any:
    """The request with what the agent's tools printed left out (what a tool observed is not a question the agent asked:
    a listing, a clock, a random id differ from run to run): chat `role: tool` messages, Responses
    `function_call_output`/`custom_tool_call_output` items, Anthropic `tool_result` blocks."""
    if isinstance(request, dict):
        if request.get("role") == "tool" or request.get("type") == "tool_result":
            return {k: ("<tool output>" if k == "content" else without_tool_output(v)) for k, v in request.items()}
        if request.get("type") in ("function_call_output", "custom_tool_call_output"):
            return {k: ("<tool output>" if k == "output" else without_tool_output(v)) for k, v in request.items()}
        return {k: without_tool_output(v) for k, v in request.items()}
    if isinstance(request, list):
        return [without_tool_output(v) for v in request]
    return request


def asked_key(request: Any) -> str:
    """`request_key` without the tools' output: equal when the agent asked the same thing of the same history."""
    return request_key(without_tool_output(request))


def request_key(request: Any) -> str:
    """A stable hash of what the agent asked (model name included, session identifiers left out), for replay."""
    text = json.dumps(comparable(request), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Transcript:
    header: dict[str, Any]
    redact: Redactor
    max_bytes: int
    exchange_max_bytes: int
    lines: list[str] = field(default_factory=list)
    size: int = 0
    truncated: bool = False
    calls: int = 0

    def add(self, exchange: dict[str, Any]) -> None:
        self.calls += 1
        exchange = {"n": self.calls, **exchange}
        for part in ("request", "response", "response_sse"):
            if part in exchange and exchange[part] is not None:
                text = exchange[part] if isinstance(exchange[part], str) else json.dumps(exchange[part])
                if len(text.encode()) > self.exchange_max_bytes:
                    exchange[part] = None
                    exchange[f"{part}_cut"] = f"over {self.exchange_max_bytes} bytes: not kept"
        line = self.redact(json.dumps(exchange, ensure_ascii=False))
        if self.size + len(line) + 1 > self.max_bytes:
            self.truncated = True
            slim = {k: v for k, v in exchange.items() if k not in ("request", "response", "response_sse")}
            slim["bodies_cut"] = "the transcript reached its size bound"
            line = self.redact(json.dumps(slim, ensure_ascii=False))
            if self.size + len(line) + 1 > self.max_bytes + 64 * 1024:
                return  # not even the summary fits: the header's count says how many calls there were
        self.lines.append(line)
        self.size += len(line) + 1

    def render(self, summary: dict[str, Any]) -> bytes:
        head = {"format": FORMAT, **self.header, **summary, "calls": self.calls, "truncated": self.truncated}
        return ("\n".join([self.redact(json.dumps(head, ensure_ascii=False)), *self.lines]) + "\n").encode()


def parse(data: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, exchanges) of a stored transcript; ValueError when it is not one."""
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    if not lines:
        raise ValueError("empty transcript")
    head = json.loads(lines[0])
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise ValueError("not a gateway transcript")
    return head, [json.loads(ln) for ln in lines[1:]]
