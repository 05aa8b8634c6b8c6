"""A real local HTTP server that speaks the OpenAI chat-completions protocol, scripted per test.

It listens on 127.0.0.1 with an ephemeral port (stdlib ``ThreadingHTTPServer`` in a daemon thread), so the
code under test goes through real sockets, real HTTP parsing and real timeouts. Each test queues replies:

    with FakeOpenAIServer() as server:
        server.enqueue(Reply.text("...", prompt_tokens=10, completion_tokens=5))
        server.enqueue(Reply.error(429, headers={"Retry-After": "7"}))
        server.enqueue(Reply.hang_up())            # closes the socket without answering
        server.enqueue(Reply.text("late", delay_s=2))
        ... point an endpoint at server.base_url ...
        assert server.requests[0].headers["authorization"] == "Bearer sk-test"

A reply may also be a callable taking the `RecordedRequest` and returning a `Reply`. When the queue is empty
the server answers with `default` (a 500 unless set), so a test that under-scripts fails loudly. Requests are
recorded in arrival order (``server.requests``, ``server.chat_requests``, ``server.call_count``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: bytes
    json: Any = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list((self.json or {}).get("messages") or [])

    @property
    def last_user_message(self) -> str:
        for m in reversed(self.messages):
            if m.get("role") == "user":
                return str(m.get("content") or "")
        return ""


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    """A dict/list is sent as JSON; bytes/str as is."""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drop_connection: bool = False

    @classmethod
    def text(
        cls,
        content: str,
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        model: str = "fake-model",
        finish_reason: str = "stop",
        delay_s: float = 0.0,
        usage: bool = True,
    ) -> Reply:
        body: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason,
                }
            ],
        }
        if usage:
            body["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
        return cls(200, body, delay_s=delay_s)

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "fake error",
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> Reply:
        body = {"error": {"message": message, "type": "fake_error", "code": code}}
        return cls(status, body, headers=dict(headers or {}), delay_s=delay_s)

    @classmethod
    def hang_up(cls) -> Reply:
        return cls(drop_connection=True)


Responder = Reply | Callable[[RecordedRequest], Reply]


class FakeOpenAIServer:
    """Scripted OpenAI-compatible server on 127.0.0.1. Use as a context manager or call start()/stop()."""

    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply.error(500, "fake server: no scripted reply left")
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Responder] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ scripting

    def enqueue(self, *replies: Responder) -> FakeOpenAIServer:
        with self._lock:
            self._queue.extend(replies)
        return self

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def call_count(self) -> int:
        return len(self.chat_requests)

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """What an endpoint's ``base_url`` should be (the client appends ``/chat/completions``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAIServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                req = RecordedRequest(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                    json=parsed,
                )
                reply = fake._next_reply(req)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.drop_connection:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                payload = reply.body
                if isinstance(payload, (dict, list)):
                    data = json.dumps(payload).encode()
                    ctype = "application/json"
                elif isinstance(payload, str):
                    data, ctype = payload.encode(), "text/plain"
                else:
                    data, ctype = (payload or b""), "application/octet-stream"
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up (timeout test); nothing to answer.
                    pass

            do_POST = _handle
            do_GET = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval keeps stop() fast (shutdown waits for the loop to notice).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _next_reply(self, req: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(req)
            if req.path.rstrip("/").endswith("/models") and req.method == "GET":
                return Reply(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            responder = self._queue.popleft() if self._queue else self.default
        return responder(req) if callable(responder) else responder

    # ------------------------------------------------------------------ helpers for work item configs

    def endpoint_config(self, *, api_key_env: str | None = None, **extra: Any) -> dict[str, Any]:
        """An endpoint dict (for `TransportConfig.endpoints`) pointing at this server."""
        return {"base_url": self.base_url, "model": "fake-model", "api_key_env": api_key_env, **extra}
