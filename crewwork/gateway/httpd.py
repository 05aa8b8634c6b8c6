"""A small HTTP/1.1 server on a unix socket (h11 does the protocol), for the gateway.

Everything a client sends is untrusted bytes from a sandbox: the request head is bounded (`max_head_bytes`), the body
too (`max_body_bytes`: a 413 before more is read), a client has `read_timeout_s` to send a whole request, and at most
`max_connections` are served at once (more wait in the socket's backlog). Responses are a body, or an async iterator of
chunks sent as they come (a server-sent stream), chunked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import h11


@dataclass(frozen=True)
class ServerBounds:
    max_head_bytes: int = 64 * 1024
    max_body_bytes: int = 8 * 1024 * 1024
    read_timeout_s: float = 60.0
    max_connections: int = 64


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    on_close: Callable[[], Awaitable[None]] | None = None
    """Called once the response is done with, sent or not (a stream that never started runs no code of its own)."""

    @classmethod
    def json(cls, status: int, payload: object, headers: dict[str, str] | None = None) -> Response:
        return cls(status, {"content-type": "application/json", **(headers or {})}, json.dumps(payload).encode())


Handler = Callable[[Request], Awaitable[Response]]


class TooLarge(Exception):
    pass


class UnixHttpServer:
    """`async with UnixHttpServer(path, handler, bounds)`: serves until the block ends (then every connection is
    closed)."""

    def __init__(self, path: Path, handler: Handler, bounds: ServerBounds) -> None:
        self.path = path
        self.handler = handler
        self.bounds = bounds
        self._server: asyncio.AbstractServer | None = None
        self._slots = asyncio.Semaphore(bounds.max_connections)
        self._tasks: set[asyncio.Task[None]] = set()
        self._dirfd: int | None = None

    async def __aenter__(self) -> UnixHttpServer:
        where = str(self.path)
        if len(where) >= 100:  # AF_UNIX's ~108 bytes: bind through a short alias of the directory
            self._dirfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            where = f"/proc/self/fd/{self._dirfd}/{self.path.name}"
        self._server = await asyncio.start_unix_server(
            self._on_connection, path=where, limit=self.bounds.max_head_bytes
        )
        os.chmod(self.path, 0o666)  # the sandbox's user connects; the directory above it is read-only to it
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._dirfd is not None:
            os.close(self._dirfd)
            self._dirfd = None
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            async with self._slots:
                await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, h11.ProtocolError, TimeoutError, asyncio.CancelledError):
            pass  # a client gone, a bound hit, or the server closing (which cancels its connections)
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.bounds.max_head_bytes)
        while True:
            try:
                request = await asyncio.wait_for(self._read_request(conn, reader), self.bounds.read_timeout_s)
            except TooLarge:
                await self._send(conn, writer, Response.json(413, {"error": {"message": "request too large"}}))
                return
            except h11.RemoteProtocolError:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self._send(conn, writer, Response.json(400, {"error": {"message": "malformed request"}}))
                return
            if request is None:
                return
            response = await self.handler(request)
            await self._send(conn, writer, response)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
                length = dict(event.headers).get(b"content-length")
                if length is not None and int(length) > self.bounds.max_body_bytes:
                    raise TooLarge()
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.bounds.max_body_bytes:
                    raise TooLarge()
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
                return Request(head.method.decode(), head.target.decode("latin-1"), headers, bytes(body))

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, response: Response) -> None:
        try:
            await self._write(conn, writer, response)
        finally:
            if response.on_close is not None:
                await asyncio.shield(response.on_close())

    async def _write(self, conn: h11.Connection, writer: asyncio.StreamWriter, response: Response) -> None:
        headers = [
            (k.encode(), v.encode("latin-1")) for k, v in response.headers.items() if k.lower() != "content-length"
        ]
        if response.stream is None:
            headers.append((b"content-length", str(len(response.body)).encode()))
        else:
            headers.append((b"transfer-encoding", b"chunked"))
        if conn.their_state is h11.MUST_CLOSE or conn.their_state is h11.ERROR:
            headers.append((b"connection", b"close"))
        writer.write(conn.send(h11.Response(status_code=response.status, headers=headers)) or b"")
        if response.stream is None:
            if response.body:
                writer.write(conn.send(h11.Data(data=response.body)) or b"")
        else:
            try:
                async for chunk in response.stream:
                    if chunk:
                        writer.write(conn.send(h11.Data(data=chunk)) or b"")
                        await writer.drain()
            finally:
                with contextlib.suppress(Exception):
                    await response.stream.aclose()  # type: ignore[attr-defined]
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
