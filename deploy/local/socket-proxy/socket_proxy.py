"""A filtering proxy to the Docker socket that takes wollomatic/socket-proxy's flags, for deploy/compose.local.yml.

docker-compose.yml runs `wollomatic/socket-proxy` (a Go program) in front of the Docker socket. Where its image cannot
be pulled (no registry) this stands in for it, reading the very same command line, so the rules in
docker-compose.yml are what is enforced when the compose stack runs locally. It is a stand-in, not the production
proxy: it implements the flags docker-compose.yml uses, with these meanings (wollomatic's documented ones):

    -listenip=IP -proxyport=N        where to listen (default 127.0.0.1:2375)
    -allowfrom=A,B                   clients allowed, as CIDRs or host names (resolved at each connection, so a
                                     compose service name covers its replicas); default 127.0.0.1/32
    -allowGET=RE -allowHEAD=RE ...   per method, a regular expression the whole request path must match; a method
                                     with no rule is refused
    -allowbindmountfrom=DIR,DIR      a container create may bind-mount only paths under these directories
    -watchdoginterval=S -stoponwatchdog   check the socket every S seconds; exit (for the restart policy) if it
                                     does not answer
    -shutdowngracetime=S             on SIGTERM, let open connections finish for up to S seconds
    -socketpath=PATH                 the Docker socket (default /var/run/docker.sock)

Each client connection carries one request: the proxy forwards it with `Connection: close` (so a second request on a
kept-alive connection is never forwarded unchecked), except an attach that upgrades to a raw stream, which is then
piped both ways. A refused request is answered 403 (405 for a method with no rule) and logged on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import posixpath
import re
import signal
import sys
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024
HEAD_TIMEOUT_S = 30.0
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
CREATE = re.compile(r"(/v\d+\.\d+)?/containers/create")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="socket-proxy", allow_abbrev=False)
    p.add_argument("-listenip", default="127.0.0.1")
    p.add_argument("-proxyport", type=int, default=2375)
    p.add_argument("-allowfrom", default="127.0.0.1/32")
    for m in METHODS:
        p.add_argument(f"-allow{m}", dest=f"allow_{m}", action="append", default=[])
    p.add_argument("-allowbindmountfrom", default="")
    p.add_argument("-watchdoginterval", type=int, default=0)
    p.add_argument("-stoponwatchdog", action="store_true")
    p.add_argument("-shutdowngracetime", type=int, default=10)
    p.add_argument("-socketpath", default="/var/run/docker.sock")
    p.add_argument("-loglevel", default="INFO")
    p.add_argument("-logjson", action="store_true")
    return p.parse_args(argv)


def log(msg: str, **fields: object) -> None:
    print(json.dumps({"msg": msg, **fields}), file=sys.stderr, flush=True)


class Proxy:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rules = {m: [re.compile(r) for r in getattr(args, f"allow_{m}")] for m in METHODS}
        self.bind_roots = [posixpath.normpath(d) for d in args.allowbindmountfrom.split(",") if d]
        self.allow_from = [a.strip() for a in args.allowfrom.split(",") if a.strip()]
        self.open: set[asyncio.Task[None]] = set()

    async def peer_allowed(self, peer: str) -> bool:
        addr = ipaddress.ip_address(peer)
        loop = asyncio.get_running_loop()
        for entry in self.allow_from:
            try:
                if addr in ipaddress.ip_network(entry, strict=False):
                    return True
                continue
            except ValueError:
                pass
            try:
                infos = await loop.getaddrinfo(entry, None)
            except OSError:
                continue
            if any(ipaddress.ip_address(info[4][0]) == addr for info in infos):
                return True
        return False

    def bind_allowed(self, source: str) -> bool:
        src = posixpath.normpath(source)
        return any(src == root or src.startswith(root.rstrip("/") + "/") for root in self.bind_roots)

    def refused_binds(self, body: bytes) -> list[str]:
        try:
            spec = json.loads(body or b"{}")
        except ValueError:
            return ["<a body that is not JSON>"]
        host = spec.get("HostConfig") or {}
        sources = [b.split(":", 1)[0] for b in host.get("Binds") or [] if b.startswith("/")]
        sources += [m.get("Source", "") for m in host.get("Mounts") or [] if m.get("Type") == "bind"]
        return [s for s in sources if not self.bind_allowed(s)]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.open.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            self.open.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")[0]
        if not await self.peer_allowed(peer):
            log("refused client", client=peer)
            return await refuse(writer, 403)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, _version = line.split(" ", 2)
        path = urlsplit(target).path
        headers = [(k.strip(), v.strip()) for k, _, v in (h.partition(":") for h in header_lines)]
        names = {k.lower(): v for k, v in headers}
        if method not in self.rules or not self.rules[method]:
            log("refused method", client=peer, method=method, path=path)
            return await refuse(writer, 405)
        if not any(r.fullmatch(path) for r in self.rules[method]):
            log("refused path", client=peer, method=method, path=path)
            return await refuse(writer, 403)
        body = await read_body(reader, names)
        if method == "POST" and CREATE.fullmatch(path) and (bad := self.refused_binds(body)):
            log("refused bind mount", client=peer, path=path, sources=bad)
            return await refuse(writer, 403)
        upgrade = "upgrade" in names.get("connection", "").lower()
        kept = [(k, v) for k, v in headers if k.lower() not in ("connection", "content-length", "transfer-encoding")]
        kept.append(("Connection", names["connection"] if upgrade else "close"))
        if body or method in ("POST", "PUT", "PATCH"):
            kept.append(("Content-Length", str(len(body))))
        up_reader, up_writer = await asyncio.open_unix_connection(self.args.socketpath)
        try:
            up_writer.write(f"{line}\r\n".encode("latin-1"))
            up_writer.write("".join(f"{k}: {v}\r\n" for k, v in kept).encode("latin-1") + b"\r\n" + body)
            await up_writer.drain()
            pipes = [pipe(up_reader, writer)]
            if upgrade:
                pipes.append(pipe(reader, up_writer))
            _done, pending = await asyncio.wait(
                [asyncio.ensure_future(p) for p in pipes], return_when="FIRST_COMPLETED"
            )
            for t in pending:
                t.cancel()
        finally:
            up_writer.close()

    async def watchdog(self) -> None:
        while True:
            await asyncio.sleep(self.args.watchdoginterval)
            try:
                r, w = await asyncio.wait_for(asyncio.open_unix_connection(self.args.socketpath), 5)
                w.write(b"GET /_ping HTTP/1.0\r\n\r\n")
                ok = (await asyncio.wait_for(r.read(64), 5)).startswith(b"HTTP/1.0 200")
                w.close()
            except (OSError, TimeoutError):
                ok = False
            if not ok:
                log("watchdog: the Docker socket does not answer", socket=self.args.socketpath)
                if self.args.stoponwatchdog:
                    sys.exit(1)


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return out
            if len(out) + size > MAX_BODY:
                raise ConnectionError("request body too large")
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise ConnectionError("request body too large")
    return await reader.readexactly(length) if length else b""


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
    except (ConnectionError, OSError):
        pass


async def refuse(writer: asyncio.StreamWriter, status: int) -> None:
    reason = {403: "Forbidden", 405: "Method Not Allowed"}[status]
    body = f"{reason}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


async def main(argv: list[str]) -> int:
    args = parse_args(argv)
    proxy = Proxy(args)
    server = await asyncio.start_server(proxy.serve, args.listenip, args.proxyport, limit=MAX_HEAD)
    log("listening", address=f"{args.listenip}:{args.proxyport}", allowfrom=proxy.allow_from)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    dog = asyncio.ensure_future(proxy.watchdog()) if args.watchdoginterval > 0 else None
    waits = [asyncio.ensure_future(stop.wait())] + ([dog] if dog else [])
    await asyncio.wait(waits, return_when="FIRST_COMPLETED")
    if dog is not None and dog.done():
        dog.result()  # the watchdog's exit
    server.close()
    if proxy.open:
        await asyncio.wait(list(proxy.open), timeout=args.shutdowngracetime)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
