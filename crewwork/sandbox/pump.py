"""One bounded socket pump, for the host and for the small relays inside sandboxes.

Three places carry bytes between a sandbox and the host: the setup proxy (crewwork/sandbox/proxy.py: its relay in
the setup sandbox, its host side), and a preview's tunnel (crewwork/preview/tunnel.py, the host's hub and front
door) with its two relays (crewwork/preview/relay.py, in the app's and the browser's sandboxes). They all copy
with the code here:

- `pump` / `splice` (host, asyncio): copy one direction / both directions, each bounded in idle time and in bytes,
  with a byte counter; a direction that ends half-closes its peer, so an HTTP client that shuts its sending side still
  gets its answer.
- `Gate` (host): how many connections one party may hold at once (a preview's front door, its relay's unfinished
  and idle tunnels). A connection over the cap is closed as soon as it is accepted, so what a tenant opens costs the
  host at most the cap in descriptors, whatever it does.
- `RELAY_PUMP` (inside a sandbox: standard-library Python source that each relay script starts with): `splice` for
  threads over blocking sockets, and `serve`, an accept loop with its own cap on concurrent connections.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

CHUNK = 64 * 1024


async def pump(
    r: asyncio.StreamReader,
    w: asyncio.StreamWriter,
    *,
    idle_s: float,
    max_bytes: int | None = None,
    count: Callable[[int], None] | None = None,
) -> None:
    """Copy `r` to `w` until end of stream, `idle_s` without a byte, or `max_bytes` (then stop reading); half-close
    `w` at the end. Errors of either side end the copy quietly: a peer that goes away is not the host's failure."""
    total = 0
    try:
        while max_bytes is None or total < max_bytes:
            data = await asyncio.wait_for(r.read(CHUNK if max_bytes is None else min(CHUNK, max_bytes - total)), idle_s)
            if not data:
                break
            total += len(data)
            if count is not None:
                count(len(data))
            w.write(data)
            await w.drain()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if w.can_write_eof():
                w.write_eof()


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    *,
    idle_s: float,
    max_bytes: int | None = None,
    count_ab: Callable[[int], None] | None = None,
    count_ba: Callable[[int], None] | None = None,
) -> None:
    """Both directions between `a` and `b` until both have ended (each bounded as in `pump`); the caller closes."""
    await asyncio.gather(
        pump(a[0], b[1], idle_s=idle_s, max_bytes=max_bytes, count=count_ab),
        pump(b[0], a[1], idle_s=idle_s, max_bytes=max_bytes, count=count_ba),
    )


class Gate:
    """At most `limit` connections held at once; `refused` counts those turned away (evidence, and for tests)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0

    def enter(self) -> bool:
        """Take a place (True) or say there is none (False: close the connection now)."""
        if self.held >= self.limit:
            self.refused += 1
            return False
        self.held += 1
        return True

    def leave(self) -> None:
        self.held = max(0, self.held - 1)

    @contextlib.asynccontextmanager
    async def holding(self, writer: asyncio.StreamWriter) -> AsyncIterator[bool]:
        """`async with gate.holding(w) as ok:` a place for the connection whose writer is `w`, released (and `w`
        closed) at the end; `ok` False: over the cap, `w` is already closed."""
        if not self.enter():
            with contextlib.suppress(Exception):
                writer.close()
            yield False
            return
        try:
            yield True
        finally:
            self.leave()
            with contextlib.suppress(Exception):
                writer.close()


RELAY_PUMP = r'''
import socket, threading
def _shut(s, how):
    try:
        s.shutdown(how)
    except OSError:
        pass
def splice(a, b, done=None):
    """Copy bytes both ways between sockets `a` and `b` in two threads; close both and call `done()` once both
    directions have ended. A direction that ends half-closes its peer; one that fails aborts both."""
    left = [2]
    lock = threading.Lock()
    def one(src, dst):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                dst.sendall(d)
            _shut(dst, socket.SHUT_WR)
        except OSError:
            _shut(src, socket.SHUT_RDWR)
            _shut(dst, socket.SHUT_RDWR)
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            a.close()
            b.close()
            if done is not None:
                done()
    threading.Thread(target=one, args=(a, b), daemon=True).start()
    threading.Thread(target=one, args=(b, a), daemon=True).start()
def serve(lst, upstream, most):
    """Accept on `lst` forever and splice each connection to a fresh `upstream()`, at most `most` at a time: one more
    is closed at once."""
    slots = threading.BoundedSemaphore(most)
    while True:
        c, _ = lst.accept()
        if not slots.acquire(blocking=False):
            c.close()
            continue
        try:
            u = upstream()
        except OSError:
            c.close()
            slots.release()
            continue
        splice(c, u, slots.release)
'''
"""The relays' pump (see the module's docstring), prepended to each relay script."""
