"""The host's side of a preview's connection: two unix sockets in a directory only the host can write.

- `hub/hub.sock` (its directory mounted read-only into the app's sandbox, and nowhere else): the app's relay dials in
  and leaves idle tunnels.
- `front/front.sock` (used by the host's HTTP probes; its directory mounted read-only into the browser's sandbox, and
  nowhere else): each connection takes an idle tunnel, asks the relay to connect it to the app, and then carries
  bytes both ways, bounded.

Two directories, so that neither side can pose as the other: the browser cannot offer the host fake tunnels (and so
answer the HTTP probes itself), and the app cannot take its own tunnels away from the probes.

Everything arriving from either side is untrusted bytes, and every connection costs the host a descriptor, so each
kind is capped per preview (crewwork.sandbox.pump.Gate; one over a cap is closed as it arrives): the hub holds at most
MAX_HUB_PENDING connections that have not said hello yet (each gets ACK_TIMEOUT_S to say it) and MAX_IDLE_TUNNELS
idle tunnels; the front door serves at most MAX_FRONT connections at once (each waits at most FRONT_WAIT_S for a
tunnel), and each exchange stops at MAX_EXCHANGE_BYTES a direction and IDLE_TIMEOUT_S without a byte. One preview
therefore holds at most MAX_HUB_PENDING + MAX_IDLE_TUNNELS + 2 * MAX_FRONT descriptors of the worker, plus the
ACCEPT_BACKLOG connections of each socket that the loop accepts in one go before it closes the ones over a cap,
whatever its app or page opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path

from crewwork.preview.relay import APP_RELAY, BROWSER_RELAY
from crewwork.sandbox.pump import Gate, splice

HELLO = b"CW1\n"
MAX_IDLE_TUNNELS = 32
MAX_HUB_PENDING = 8
MAX_FRONT = 64
ACCEPT_BACKLOG = 16
"""Each socket's listen backlog, which is also how many connections the loop accepts at once before any is closed."""
ACK_TIMEOUT_S = 6.0
FRONT_WAIT_S = 10.0
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
        self.hub_gate = Gate(MAX_HUB_PENDING)
        """Hub connections that have not said hello yet."""
        self.front_gate = Gate(MAX_FRONT)
        """Front-door connections being served (waiting for a tunnel, or carrying bytes through one)."""

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
            for handler, sock in ((self._on_hub, self.hub), (self._on_front, self.front)):
                server = await asyncio.start_unix_server(handler, path=self.short(sock), backlog=ACCEPT_BACKLOG)
                self._servers.append(server)
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
        if not self.hub_gate.enter():
            writer.close()
            return
        try:
            hello = await asyncio.wait_for(reader.readexactly(len(HELLO)), ACK_TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            writer.close()
            return
        finally:
            self.hub_gate.leave()
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
            async with self.front_gate.holding(writer) as admitted:
                if not admitted:
                    return
                try:
                    up = await self.connect(FRONT_WAIT_S)
                except ConnectionError:
                    return
                try:
                    await splice((reader, writer), up, idle_s=IDLE_TIMEOUT_S, max_bytes=MAX_EXCHANGE_BYTES)
                finally:
                    up[1].close()
        finally:
            self._tasks.discard(task)
