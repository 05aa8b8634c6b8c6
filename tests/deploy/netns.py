"""Hosts as network namespaces: each "host" is a netns joined to this machine by a veth pair, with its own disk
(directories no other host sees), reaching only the services on one service address (10.A.255.1, an address of the
root namespace's loopback; there is no dummy interface module on these machines): PostgreSQL and Temporal through TCP relays, the git server directly. A host can be frozen (its
link cut, every process of it stopped: to the rest of the deployment it is dead, however long) and thawed (it comes
back and carries on from where it stopped, as a host that lost power, or a partitioned one, does). Needs root."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from crewwork.cli.stack import ManagedProcess


def ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(argv, check=True, capture_output=True)


class Relay:
    """TCP from `listen` to `target`, one background thread with its own event loop."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen, self.target = listen, target
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.conns: dict[str, list[asyncio.StreamWriter]] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            with contextlib.suppress(Exception):
                w.close()

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                tr, tw = await asyncio.open_connection(*self.target)
            except OSError:
                w.close()
                return
            peer = w.get_extra_info("peername")[0]
            self.conns.setdefault(peer, []).extend([w, tw])
            await asyncio.gather(pump(r, tw), pump(tr, w))

        async def main() -> None:
            self.server = await asyncio.start_server(handle, *self.listen, reuse_address=True)
            self.ready.set()
            await self.server.serve_forever()

        with contextlib.suppress(Exception):
            self.loop.run_until_complete(main())

    def start(self) -> Relay:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError(f"relay {self.listen} -> {self.target} did not start")
        return self

    def drop(self, peer: str) -> None:
        """Close every connection from `peer` on both sides: the service notices the peer is gone (what a server's
        keepalive does for a dead host, within a minute or so, here at once)."""

        def close() -> None:
            for w in self.conns.pop(peer, []):
                with contextlib.suppress(Exception):
                    w.transport.abort()

        self.loop.call_soon_threadsafe(close)

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            for task in asyncio.all_tasks(self.loop):
                task.cancel()

        self.loop.call_soon_threadsafe(close)
        self.thread.join(5)


class NetHost:
    """One host: a network namespace, its own directory tree, the processes it runs."""

    def __init__(self, net: Network, index: int) -> None:
        self.net = net
        self.index = index
        self.name = f"{net.tag}{index}"
        self.ns = f"cw{self.name}"
        self.root = net.base / f"host-{index}"
        self.root.mkdir(parents=True)
        self.procs: list[ManagedProcess] = []
        self.frozen: list[int] = []
        self.outer, self.inner = f"{self.ns}h", f"{self.ns}n"
        a = net.octet
        ip("netns", "add", self.ns)
        ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        ip("link", "set", self.inner, "netns", self.ns)
        ip("addr", "add", f"10.{a}.{index}.1/24", "dev", self.outer)
        ip("link", "set", self.outer, "up")
        ip("addr", "add", f"10.{a}.{index}.2/24", "dev", self.inner, netns=self.ns)
        ip("link", "set", self.inner, "up", netns=self.ns)
        ip("link", "set", "lo", "up", netns=self.ns)
        ip("route", "add", f"{net.service}/32", "via", f"10.{a}.{index}.1", netns=self.ns)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> ManagedProcess:
        p = ManagedProcess(
            f"{name}@{self.name}", ["ip", "netns", "exec", self.ns, *argv], env, self.root / f"{name}.log"
        )
        p.start()
        self.procs.append(p)
        return p

    def pids(self) -> set[int]:
        """Every live process of this host: its processes and all their descendants."""
        parents: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        found = {p.proc.pid for p in self.procs if p.proc is not None and p.proc.poll() is None}
        grew = True
        while grew:
            more = {pid for pid, ppid in parents.items() if ppid in found and pid not in found}
            found |= more
            grew = bool(more)
        return found

    @property
    def address(self) -> str:
        return f"10.{self.net.octet}.{self.index}.2"

    def freeze(self) -> None:
        """The host dies, as far as anyone else can tell: its link goes down, every process of it stops, and the
        services drop its connections (as their keepalives would notice a dead peer; until they do, a dead host's
        open long-polls can take tasks, each lost until its timeout: docs/reliability.md, "Hosts that die")."""
        ip("link", "set", self.outer, "down")
        for relay in self.net.relays:
            relay.drop(self.address)
        self.frozen = sorted(self.pids())
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """It comes back: link up, every process carries on where it stopped."""
        ip("link", "set", self.outer, "up")
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def stop(self) -> None:
        self.thaw()
        for p in self.procs:
            p.stop(grace_s=10)

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", self.outer)
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("netns", "del", self.ns)


class Network:
    """The hosts, the service address they all reach, and the relays behind it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.tag = uuid.uuid4().hex[:6]
        self.octet = random.randint(100, 199)
        self.service = f"10.{self.octet}.255.1"
        self.hosts: list[NetHost] = []
        self.relays: list[Relay] = []
        ip("addr", "add", f"{self.service}/32", "dev", "lo")

    @property
    def cidr(self) -> str:
        return f"10.{self.octet}.0.0/16"

    def relay(self, port: int, target: tuple[str, int]) -> int:
        self.relays.append(Relay((self.service, port), target).start())
        return port

    def host(self) -> NetHost:
        h = NetHost(self, len(self.hosts) + 1)
        self.hosts.append(h)
        return h

    def close(self) -> None:
        for h in self.hosts:
            with contextlib.suppress(Exception):
                h.stop()
        for r in self.relays:
            with contextlib.suppress(Exception):
                r.stop()
        for h in self.hosts:
            h.remove()
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("addr", "del", f"{self.service}/32", "dev", "lo")


def available() -> str | None:
    """Why network namespaces cannot be used here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    probe = f"cwprobe{os.getpid() % 100000}"
    try:
        ip("netns", "add", probe)
        ip("netns", "del", probe)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        return f"ip netns does not work here: {exc}"
    return None


PYTHON = sys.executable
