"""The host's side of a preview's connection: two unix sockets in a directory only the host can write.

- `hub/hub.sock` (its directory mounted read-only into the app's sandbox, and nowhere else): the app's relay dials in
  and leaves idle tunnels.
- `front/front.sock` (used by the host's HTTP probes; its directory mounted read-only into the browser's sandbox, and
  nowhere else): each connection takes an idle tunnel, asks the relay to connect it to the app, and then carries
  bytes both ways, bounded.

Two directories, so that neither side can pose as the other: the browser cannot offer the host fake tunnels (and so
answer the HTTP probes itself), and the app cannot take its own tunnels away from the probes.

Everything arriving from either side is untrusted bytes: the hub accepts a bounded number of idle tunnels, each
one answers a one-byte protocol within a deadline, and an exchange stops at a size and an idle time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path

from crewwork.preview.relay import APP_RELAY, BROWSER_RELAY

HELLO = b"CW1\n"
MAX_IDLE_TUNNELS = 32
ACK_TIMEOUT_S = 6.0
IDLE_TIMEOUT_S = 120.0
MAX_EXCHANGE_BYTES = 256 * 1024 * 1024


class AppRefused(ConnectionError):
    """The relay is there but nothing listens on the app's port (yet)."""


class NoTunnel(ConnectionError):
    """The app's relay has not connected to the host (not started, gone, or it cannot reach the socket)."""


class Tunnels:
    """The hub and the front door of one preview. `async with Tunnels(root)`; removed on exit."""

    def __init__(self, root: Path) -> None:
        self.dir = root / uuid.uuid4().hex[:12]
        self.dialed = 0
        """Tunnels the relay has opened so far (0: it never reached the host)."""
        self._idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue(MAX_IDLE_TUNNELS)
        self._servers: list[asyncio.AbstractServer] = []
        self._dirfd: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def hub_dir(self) -> Path:
        return self.dir / "hub"

    @property
    def front_dir(self) -> Path:
        return self.dir / "front"

    @property
    def hub(self) -> Path:
        return self.hub_dir / "hub.sock"

    @property
    def front(self) -> Path:
        return self.front_dir / "front.sock"

    @property
    def app_relay(self) -> Path:
        return self.hub_dir / "relay.py"

    @property
    def browser_relay(self) -> Path:
        return self.front_dir / "browser-relay.py"

    def short(self, sock: Path) -> str:
        """A path to `sock` that fits AF_UNIX's ~108 bytes (through this process's descriptor of the directory)."""
        path = str(sock)
        return path if len(path) < 100 else f"/proc/self/fd/{self._dirfd}/{sock.parent.name}/{sock.name}"

    async def __aenter__(self) -> Tunnels:
        for d in (self.dir, self.hub_dir, self.front_dir):
            d.mkdir(parents=True, mode=0o755)
            d.chmod(0o755)  # the sandbox user reads the relays and connects to the sockets; never writes here
        self.app_relay.write_text(APP_RELAY)
        self.browser_relay.write_text(BROWSER_RELAY)
        self._dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._servers.append(await asyncio.start_unix_server(self._on_hub, path=self.short(self.hub)))
            self._servers.append(await asyncio.start_unix_server(self._on_front, path=self.short(self.front)))
            for sock in (self.hub, self.front):
                os.chmod(sock, 0o666)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        while not self._idle.empty():
            _r, w = self._idle.get_nowait()
            w.close()
        self._servers.clear()
        if self._dirfd is not None:
            os.close(self._dirfd)
            self._dirfd = None
        for path in (self.hub, self.front, self.app_relay, self.browser_relay):
            with contextlib.suppress(OSError):
                path.unlink()
        for d in (self.hub_dir, self.front_dir, self.dir):
            with contextlib.suppress(OSError):
                d.rmdir()

    async def _on_hub(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await asyncio.wait_for(reader.readexactly(len(HELLO)), ACK_TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            writer.close()
            return
        if hello != HELLO or self._idle.full():
            writer.close()
            return
        self.dialed += 1
        self._idle.put_nowait((reader, writer))

    async def connect(self, timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A stream to the app's port, through an idle tunnel. NoTunnel or AppRefused when there is none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise NoTunnel("the app's relay has not connected to the host")
            try:
                reader, writer = await asyncio.wait_for(self._idle.get(), left)
            except TimeoutError:
                raise NoTunnel("the app's relay has not connected to the host") from None
            try:
                writer.write(b"G")
                await writer.drain()
                ack = await asyncio.wait_for(reader.readexactly(1), ACK_TIMEOUT_S)
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                writer.close()  # a tunnel of a relay that is gone: try the next one
                continue
            if ack == b"+":
                return reader, writer
            writer.close()
            raise AppRefused("connection refused: nothing listens on the app's port")

    async def _on_front(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                up_r, up_w = await self.connect(10.0)
            except ConnectionError:
                return
            try:
                await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
            finally:
                up_w.close()
        finally:
            self._tasks.discard(task)
            writer.close()


async def _pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    total = 0
    try:
        while total < MAX_EXCHANGE_BYTES:
            data = await asyncio.wait_for(r.read(65536), IDLE_TIMEOUT_S)
            if not data:
                break
            total += len(data)
            w.write(data)
            await w.drain()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if w.can_write_eof():
                w.write_eof()
