"""Network for setup commands, limited to an operator allowlist: an HTTP(S) proxy on a unix socket, and a relay.

How a setup sandbox reaches the network, and why this way:

    setup command --HTTP(S)_PROXY--> relay (inside the sandbox, 127.0.0.1:PORT of the sandbox's own empty
    network namespace) --unix socket, bind-mounted read-only--> AllowlistProxy (host, in the worker)
    --TCP--> an allowlisted host:port only

The sandbox keeps its private network namespace with nothing in it but loopback (bwrap `--unshare-net`, Docker
`--network=none`): it has no route, no DNS and no address of the host. Its only way out is the unix socket of the
proxy, which accepts `CONNECT host:port` (HTTPS, end-to-end TLS through the tunnel) and absolute-form plain HTTP
requests, and only to the exact `host:port` entries (or `*.domain:port` wildcards) the operator listed in
`CREWWORK_SETUP_NETWORK_ALLOWLIST`. Everything else gets `403` and is recorded.

Compared with a network namespace and a veth pair whose peer is the proxy on the host: no root needed, no
iptables rules to keep the host's other services (PostgreSQL, Docker's API, metadata endpoints) off the veth
address, no namespaces or interfaces to leak when a worker dies, and it works the same for bwrap and Docker (the
socket is a bind mount). The proxy sees host names, not just addresses, so the allowlist names hosts. Under gVisor,
connecting to a host unix socket needs runsc's `--host-uds=open`; without it the relay says so and setup fails.

The relay is a small standard-library Python program (`RELAY`), written next to the socket: it binds its port,
exports HTTP_PROXY/HTTPS_PROXY (and lower-case) to the setup command, forks a forwarder and execs the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.sandbox.pump import RELAY_PUMP, Gate, splice

MAX_HEAD = 64 * 1024
CONNECT_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 300.0
MAX_CONNECTIONS = 64
"""Connections one setup run may hold through the proxy at once; more are closed as they arrive."""

RELAY = (
    RELAY_PUMP
    + r"""
import os, socket, sys, threading
sock_path, argv = sys.argv[1], sys.argv[3:]
ACTIVE = 64
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0))
lst.listen(64)
port = lst.getsockname()[1]
proxy = f"http://127.0.0.1:{port}"
for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
    os.environ[k] = proxy
os.environ.pop("NO_PROXY", None); os.environ.pop("no_proxy", None)
def connect_unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if len(sock_path) < 100:
        s.connect(sock_path)
    else:
        fd = os.open(os.path.dirname(sock_path), os.O_RDONLY)
        try:
            s.connect(f"/proc/self/fd/{fd}/" + os.path.basename(sock_path))
        finally:
            os.close(fd)
    return s
try:
    connect_unix().close()
except OSError as e:
    sys.stderr.write(f"crewwork setup network: cannot reach the allowlisting proxy ({e}); under gVisor the "
                     "runtime needs --host-uds=open\n")
    sys.exit(97)
parent = os.getpid()
if os.fork() == 0:
    try:
        os.setsid()
    except OSError:
        pass
    def watchdog():
        import time
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watchdog, daemon=True).start()
    serve(lst, connect_unix, ACTIVE)
    os._exit(0)
lst.close()
os.execvp(argv[0], argv)
"""
)


@dataclass
class Decision:
    target: str
    allowed: bool
    method: str
    at: float
    bytes_up: int = 0
    bytes_down: int = 0

    def count(self, which: str, n: int) -> None:
        setattr(self, which, getattr(self, which) + n)


def _normalise_entry(entry: str) -> str:
    entry = entry.strip().lower()
    if not re.match(r"^(\*\.)?(\[[0-9a-f:.]+\]|[a-z0-9.-]+):\d{1,5}$", entry):
        raise ValueError(f"setup network allowlist entry {entry!r} is not host:port or *.domain:port")
    return entry


def allowed(allowlist: Sequence[str], target: str) -> bool:
    target = target.lower()
    host, _, port = target.rpartition(":")
    for entry in allowlist:
        ehost, _, eport = entry.rpartition(":")
        if eport != port:
            continue
        if ehost == host or (ehost.startswith("*.") and host.endswith(ehost[1:]) and host != ehost[2:]):
            return True
    return False


@dataclass
class AllowlistProxy:
    """The host side: a CONNECT / absolute-form HTTP proxy on a unix socket that reaches only `allowlist`."""

    allowlist: list[str]
    sock_dir: Path
    decisions: list[Decision] = field(default_factory=list)
    _server: asyncio.AbstractServer | None = None
    _dirfd: int | None = None
    _gate: Gate = field(default_factory=lambda: Gate(MAX_CONNECTIONS))

    def __post_init__(self) -> None:
        self.allowlist = [_normalise_entry(e) for e in self.allowlist]

    @property
    def sock_path(self) -> Path:
        return self.sock_dir / "proxy.sock"

    @property
    def relay_path(self) -> Path:
        return self.sock_dir / "relay.py"

    def wrap(self, argv: Sequence[str], python: str = "python3", inside: str | None = None) -> list[str]:
        """`argv` run behind the relay: it gets HTTP(S)_PROXY pointing at the relay, nothing else changes. `inside`:
        where the sandbox sees `sock_dir` (default: its host path)."""
        where = inside or str(self.sock_dir)
        return [python, f"{where}/{self.relay_path.name}", f"{where}/{self.sock_path.name}", "--", *argv]

    async def __aenter__(self) -> AllowlistProxy:
        self.sock_dir.mkdir(parents=True, exist_ok=True)
        self.sock_dir.chmod(0o755)
        self.relay_path.write_text(RELAY)
        self.relay_path.chmod(0o644)
        path = str(self.sock_path)
        if len(path) >= 100:
            # AF_UNIX paths are limited to ~108 bytes: bind through a short /proc/self/fd/N/ alias of the directory.
            self._dirfd = os.open(self.sock_dir, os.O_RDONLY)
            path = f"/proc/self/fd/{self._dirfd}/proxy.sock"
        self._server = await asyncio.start_unix_server(self._handle, path=path)
        # The sandbox runs as another user (nobody) or a mapped root without capabilities.
        os.chmod(self.sock_path, 0o666)
        return self

    async def __aexit__(self, *exc: object) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        dirfd, self._dirfd = self._dirfd, None
        if dirfd is not None:
            os.close(dirfd)
        with contextlib.suppress(OSError):
            self.sock_path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self._gate.holding(writer) as admitted:
            if admitted:
                with contextlib.suppress(
                    OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError
                ):
                    await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if len(head) > MAX_HEAD:
            return await _reply(writer, 431, "request head too large")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return await _reply(writer, 400, "malformed request line")
        method, target, version = parts
        if method == "CONNECT":
            dest = target
            forward = b""
        else:
            m = re.match(r"^http://([^/?#\s]+)(/[^\s]*)?$", target, re.I)
            if not m:
                return await _reply(writer, 400, "only CONNECT and absolute http:// requests are proxied")
            authority, path = m.group(1), m.group(2) or "/"
            if "@" in authority:
                return await _reply(writer, 400, "user info in proxied URLs is not allowed")
            dest = authority if re.search(r":\d+$", authority) else f"{authority}:80"
            kept = [
                ln for ln in lines[1:] if ln and not ln.lower().startswith(("proxy-", "connection:", "keep-alive:"))
            ]
            forward = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""]).encode("latin-1")
        decision = Decision(target=dest.lower(), allowed=allowed(self.allowlist, dest), method=method, at=time.time())
        self.decisions.append(decision)
        if not decision.allowed:
            return await _reply(
                writer, 403, f"crewwork setup proxy: {dest} is not on the operator's setup network allowlist"
            )
        host, _, port = dest.rpartition(":")
        host = host.strip("[]")
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            return await _reply(writer, 502, f"crewwork setup proxy: cannot connect to {dest}: {exc}")
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                up_w.write(forward)
                await up_w.drain()
            await splice(
                (reader, writer),
                (up_r, up_w),
                idle_s=IDLE_TIMEOUT_S,
                count_ab=lambda n: decision.count("bytes_up", n),
                count_ba=lambda n: decision.count("bytes_down", n),
            )
        finally:
            with contextlib.suppress(Exception):
                up_w.close()

    def summary(self) -> list[dict[str, object]]:
        """What the setup asked for, as evidence (one entry per request, in order)."""
        return [
            {"target": d.target, "allowed": d.allowed, "method": d.method, "up": d.bytes_up, "down": d.bytes_down}
            for d in self.decisions
        ]


async def _reply(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}
    body = (text + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


def new_sock_dir(root: Path) -> Path:
    return root / ".net" / uuid.uuid4().hex[:12]
