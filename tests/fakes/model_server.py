"""A real local HTTP server that speaks the three model protocols agent CLIs use, and scripts the model's turns.

OpenAI Chat Completions (`POST .../chat/completions`), OpenAI Responses (`POST .../responses`) and Anthropic Messages
(`POST .../messages`), each as JSON or as a server-sent event stream (`"stream": true`), with tool calls. It listens on
127.0.0.1 (stdlib `ThreadingHTTPServer` in a daemon thread), so what talks to it goes through real sockets and real
HTTP; it is the one boundary the tests cannot run for real (a hosted model provider).

A test scripts the *agent's* turns, the ones that carry tools (the CLI's main loop), as a list of `Turn`s; requests
without tools (a CLI's side calls: titles, summaries, quota probes) get a short text answer and consume nothing:

    with FakeModelServer() as server:
        server.script(Turn.call("Bash", {"command": "env"}), Turn.text("done"))
        ... point the gateway's endpoint at server.base_url ...
        server.requests[1].json["messages"]   # the CLI's second request, with the tool's output

A `Turn` may be a callable taking the `Seen` request and returning a `Turn` (to answer from what the CLI sent). When
the script is used up the server answers `Turn.text("done")`, so a CLI that loops stops.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY_HEADER_NAMES = ("authorization", "x-api-key", "api-key")


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: bytes
    json: Any = None

    @property
    def protocol(self) -> str:
        return protocol_of(self.path)

    @property
    def has_tools(self) -> bool:
        return bool(isinstance(self.json, dict) and self.json.get("tools"))

    @property
    def streaming(self) -> bool:
        return bool(isinstance(self.json, dict) and self.json.get("stream"))

    def text(self) -> str:
        """Every string in the request body, joined: what a test searches for a tool's output."""
        return self.body.decode("utf-8", "replace")


@dataclass
class Turn:
    """One model turn: text, or a tool call (the name as the CLI declared it, and its arguments)."""

    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] | str = field(default_factory=dict)
    """A dict (sent as JSON), or a string: the raw input of a free-form tool (Codex's apply_patch)."""
    prompt_tokens: int = 100
    completion_tokens: int = 20
    status: int = 200
    error: str | None = None

    @classmethod
    def say(cls, text: str, **kw: Any) -> Turn:
        return cls(text=text, **kw)

    @classmethod
    def call(cls, tool: str, arguments: dict[str, Any] | str, **kw: Any) -> Turn:
        return cls(tool=tool, arguments=arguments, **kw)

    @classmethod
    def fail(cls, status: int, message: str = "scripted failure") -> Turn:
        return cls(status=status, error=message)


Scripted = Turn | Callable[[Seen], Turn]


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many agents (or a benchmark's sessions) connect at once; 5 would drop their SYNs
    daemon_threads = True


def protocol_of(path: str) -> str:
    p = path.split("?", 1)[0].rstrip("/")
    if p.endswith("/chat/completions"):
        return "chat"
    if p.endswith("/responses"):
        return "responses"
    if p.endswith("/messages"):
        return "messages"
    return "other"


class FakeModelServer:
    """Scripted model server on 127.0.0.1. Use as a context manager or call start()/stop()."""

    def __init__(self, side_answer: str = "ok") -> None:
        self.requests: list[Seen] = []
        self.side_answer = side_answer
        self._script: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def script(self, *turns: Scripted) -> FakeModelServer:
        with self._lock:
            self._script.extend(turns)
        return self

    @property
    def left(self) -> int:
        with self._lock:
            return len(self._script)

    @property
    def model_calls(self) -> list[Seen]:
        with self._lock:
            return [r for r in self.requests if r.protocol != "other"]

    @property
    def agent_calls(self) -> list[Seen]:
        """The requests that carried tools (the agent's own turns)."""
        return [r for r in self.model_calls if r.has_tools]

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def endpoint(self, *, protocols: list[str], model: str = "fake-model", **extra: Any) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": model, "protocols": protocols, **extra}

    # ------------------------------------------------------------------ serving

    def _next(self, seen: Seen) -> Turn:
        with self._lock:
            self.requests.append(seen)
            if not seen.has_tools:
                return Turn.say(self.side_answer, prompt_tokens=10, completion_tokens=2)
            scripted = self._script.popleft() if self._script else Turn.say("done")
        return scripted(seen) if callable(scripted) else scripted

    def start(self) -> FakeModelServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as written, not 40 ms apart

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                seen = Seen("GET", self.path, {k.lower(): v for k, v in self.headers.items()}, b"")
                with fake._lock:
                    fake.requests.append(seen)
                if self.path.split("?")[0].rstrip("/").endswith("/models"):
                    return self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                return self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, parsed)
                proto = seen.protocol
                if proto == "other":
                    if self.path.split("?")[0].endswith("/count_tokens"):
                        with fake._lock:
                            fake.requests.append(seen)
                        return self._json(200, {"input_tokens": max(1, len(body) // 4)})
                    return self._json(404, {"error": {"message": f"no such path {self.path}"}})
                turn = fake._next(seen)
                if turn.error is not None:
                    return self._json(turn.status, _error(proto, turn.status, turn.error))
                model = str((parsed or {}).get("model") or "fake-model")
                if seen.streaming:
                    events = list(_stream(proto, turn, model, (parsed or {}).get("stream_options")))
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    try:
                        for chunk in events:
                            self.wfile.write(chunk)
                            self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    self.close_connection = True
                    return None
                return self._json(200, _whole(proto, turn, model))

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-model", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------- the three protocols


def _args(turn: Turn) -> str:
    return turn.arguments if isinstance(turn.arguments, str) else json.dumps(turn.arguments)


def _error(proto: str, status: int, message: str) -> dict[str, Any]:
    if proto == "messages":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    return {"error": {"message": message, "type": "server_error", "code": str(status)}}


def _whole(proto: str, turn: Turn, model: str) -> dict[str, Any]:
    pt, ct = turn.prompt_tokens, turn.completion_tokens
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    if proto == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.tool:
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": turn.tool, "arguments": _args(turn)}}
            ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if turn.tool else "stop"}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        }
    if proto == "responses":
        return _response_object(turn, model, call_id, "completed")
    content: list[dict[str, Any]] = []
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    if turn.tool:
        content.append({"type": "tool_use", "id": f"toolu_{call_id[5:]}", "name": turn.tool, "input": turn.arguments})
    return {
        "id": f"msg_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if turn.tool else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": pt, "output_tokens": ct},
    }


def _response_items(turn: Turn, call_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if turn.text:
        items.append(
            {
                "type": "message",
                "id": f"msg_{call_id[5:]}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
            }
        )
    if turn.tool:
        if isinstance(turn.arguments, str):
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{call_id[5:]}",
                    "status": "completed",
                    "call_id": call_id,
                    "name": turn.tool,
                    "input": turn.arguments,
                }
            )
        else:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{call_id[5:]}",
                    "status": "completed",
                    "call_id": call_id,
                    "name": turn.tool,
                    "arguments": _args(turn),
                }
            )
    return items


def _response_object(turn: Turn, model: str, call_id: str, status: str) -> dict[str, Any]:
    pt, ct = turn.prompt_tokens, turn.completion_tokens
    return {
        "id": f"resp_{call_id[5:]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": _response_items(turn, call_id) if status == "completed" else [],
        "usage": {
            "input_tokens": pt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": ct,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": pt + ct,
        }
        if status == "completed"
        else None,
    }


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _stream(proto: str, turn: Turn, model: str, stream_options: Any) -> Iterator[bytes]:
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    pt, ct = turn.prompt_tokens, turn.completion_tokens
    if proto == "chat":
        base = {"id": f"chatcmpl-{call_id[5:]}", "object": "chat.completion.chunk", "created": 0, "model": model}
        yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for piece in _pieces(turn.text):
            yield _sse({**base, "choices": [{"index": 0, "delta": {"content": piece}}]})
        if turn.tool:
            args = _args(turn)
            first = {"index": 0, "id": call_id, "type": "function", "function": {"name": turn.tool, "arguments": ""}}
            yield _sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
            for piece in _pieces(args):
                more = {"index": 0, "function": {"arguments": piece}}
                yield _sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [more]}}]})
        finish = "tool_calls" if turn.tool else "stop"
        yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if isinstance(stream_options, dict) and stream_options.get("include_usage"):
            usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
            yield _sse({**base, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"
        return
    if proto == "responses":
        seq = iter(range(1_000_000))
        started = _response_object(turn, model, call_id, "in_progress")
        yield _sse({"type": "response.created", "sequence_number": next(seq), "response": started}, "response.created")
        for i, item in enumerate(_response_items(turn, call_id)):
            opened = {**item, "status": "in_progress"}
            if item["type"] == "message":
                opened["content"] = []
            ev = {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": i, "item": opened}
            yield _sse(ev, ev["type"])
            if item["type"] == "message":
                for piece in _pieces(turn.text):
                    ev = {
                        "type": "response.output_text.delta",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": i,
                        "content_index": 0,
                        "delta": piece,
                    }
                    yield _sse(ev, ev["type"])
            ev = {"type": "response.output_item.done", "sequence_number": next(seq), "output_index": i, "item": item}
            yield _sse(ev, ev["type"])
        done = _response_object(turn, model, call_id, "completed")
        ev = {"type": "response.completed", "sequence_number": next(seq), "response": done}
        yield _sse(ev, ev["type"])
        return
    msg_id = f"msg_{call_id[5:]}"
    start = {
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": pt, "output_tokens": 1},
        },
    }
    yield _sse(start, "message_start")
    index = 0
    if turn.text:
        block = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        yield _sse(block, block["type"])
        for piece in _pieces(turn.text):
            delta = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
            yield _sse(delta, delta["type"])
        yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop")
        index += 1
    if turn.tool:
        tool = {"type": "tool_use", "id": f"toolu_{call_id[5:]}", "name": turn.tool, "input": {}}
        block = {"type": "content_block_start", "index": index, "content_block": tool}
        yield _sse(block, block["type"])
        for piece in _pieces(_args(turn)):
            delta = {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
            yield _sse(delta, delta["type"])
        yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    stop = "tool_use" if turn.tool else "end_turn"
    delta_msg = {
        "type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": ct},
    }
    yield _sse(delta_msg, "message_delta")
    yield _sse({"type": "message_stop"}, "message_stop")


def _pieces(text: str, size: int = 24) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] if text else []
