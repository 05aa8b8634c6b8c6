"""Agent code runs in a child process of the agent pool, so that it can always be stopped.

Agent code is not the platform's: a plugin, the command agent's glue, the scripted agent's test faults. If it ran in
the pool's own process, a synchronous `time.sleep`, a busy loop, a thread blocked in C or code that swallows
`CancelledError` would hold the pool's slot (and its event loop) for as long as it liked, and cancelling the item or
its timeout could not take the slot back; `os._exit` would take the whole pool down with every other tenant's
running item.

So each slot has a persistent child process (crewwork.agents.child: its own session and process group, forked by
the pool's zygote, which has done the agents' imports once: crewwork.agents.zygote) that runs one agent call after
another; the per-task cost is a round trip of pickled messages over a socket pair (bench/flood.py measures it). The
activity stays in the parent: its fenced store writes, the heartbeats to Temporal, the self-fencing probe and the
workspace all live there (crewwork.steps.attempt.watch), and the child's callbacks (`heartbeat`, `ensure_current`,
`save_artifact`) are messages back to it. When the activity is cancelled (the item was cancelled, Temporal timed the
attempt out, a later attempt superseded it) the parent kills the child's whole process group, SIGTERM then SIGKILL
after `KILL_GRACE_S`, and a fresh child takes the slot; when the child dies by itself (a crash), the attempt fails
with a retryable infrastructure error and the pool carries on.

Agents that only do cancellable network I/O may run inline (`Agent.runs_inline`): the model agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from crewwork.agents.base import AgentContext, AgentInfraError, AgentRunResult
from crewwork.agents.child import portable
from crewwork.agents.zygote import zygote

log = logging.getLogger("crewwork.agents.isolation")

KILL_GRACE_S = 1.0
"""Between SIGTERM (the child cancels its agent, so a sandbox container is removed) and SIGKILL of its group."""
START_TIMEOUT_S = 60.0
SPARE = 1
"""Warm children kept beyond one per slot: a slot freed by a kill takes the spare at once instead of waiting for a
fresh child to be forked and say `ready` while the replacement starts in the background."""

# Fields of AgentContext that cross to the child as they are; the callables are replaced by messages.
_PLAIN_FIELDS = (
    "work_item_id",
    "attempt",
    "activity_attempt",
    "kind",
    "config",
    "instruction",
    "input",
    "workspace",
    "diagnostics",
    "review_comment",
    "limits",
    "resume_details",
    "host_workspace",
)


class AgentProcessDied(AgentInfraError):
    """The child running the agent exited (a crash, an OOM kill) before answering: retried like any infra fault."""


@dataclass(frozen=True)
class AgentCall:
    """What the child needs to run one agent: its name, the context's plain fields and how to get a sandbox."""

    agent: str
    plugins: str
    fields: dict[str, Any]
    sandbox_recipe: tuple[str, bool, Any] | None = None
    """(backend name, allow_unsafe, SandboxSettings | None) of the sandbox the parent chose: the child makes its
    own instance of it (a Docker client does not cross a process boundary)."""
    extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """The pool process's environment at the call: agent code sees what it would see inline (the operator's
    command-agent and plugin settings, provider keys), even if it changed after the child started."""


class AgentChild:
    """One persistent child process and its end of the socket pair."""

    def __init__(self) -> None:
        parent, child = socket.socketpair()
        self._sock = parent
        self.conn = Connection(os.dup(parent.fileno()))
        parent.close()
        # Forked by this process's zygote, which has done the child's imports once (crewwork.agents.zygote).
        self.proc = zygote().spawn(child.fileno())
        child.close()
        self.ready = False
        self.tasks = 0

    async def wait_ready(self) -> None:
        if self.ready:
            return
        msg = await asyncio.wait_for(self._recv(), START_TIMEOUT_S)
        if msg != ("ready",):
            raise AgentInfraError(f"agent process did not start: {msg!r}")
        self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, msg: Any) -> None:
        self.conn.send(msg)

    async def _recv(self) -> Any:
        loop = asyncio.get_running_loop()
        fd = self.conn.fileno()
        while True:
            if self.conn.poll():
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    return ("eof",)
            got: asyncio.Future[None] = loop.create_future()

            def readable(g: asyncio.Future[None] = got) -> None:
                if not g.done():
                    g.set_result(None)

            loop.add_reader(fd, readable)
            try:
                await got
            finally:
                loop.remove_reader(fd)

    async def recv(self) -> Any:
        return await self._recv()

    def kill(self) -> None:
        """SIGTERM the child's process group, then SIGKILL it after the grace (blocking for at most the grace)."""
        pid = self.proc.pid
        if pid is None:  # never forked
            self.close()
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        try:
            self.proc.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # also whatever the agent left running in its group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


class AgentProcesses:
    """The agent pool's children: one per slot, started ahead, reused while healthy, replaced when killed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[AgentChild] = []
        self.started = 0
        self.killed = 0

    @property
    def capacity(self) -> int:
        return self.size + SPARE

    def prestart(self) -> None:
        """Start children up to the pool's size (at worker start, so the first task does not pay for it)."""
        while len(self._idle) < self.capacity:
            self._idle.append(self._spawn())

    def _spawn(self) -> AgentChild:
        self.started += 1
        return AgentChild()

    async def acquire(self) -> AgentChild:
        # A child that has said `ready` (or whose `ready` is waiting to be read) first: no wait for imports.
        self._idle.sort(key=lambda c: c.ready or c.conn.poll())
        while self._idle:
            child = self._idle.pop()
            if child.alive():
                return await self._ready(child)
            child.close()
        return await self._ready(self._spawn())

    async def _ready(self, child: AgentChild) -> AgentChild:
        try:
            await child.wait_ready()
        except BaseException:  # cancelled while it started, or it never did: it belongs to no one, so it goes
            await asyncio.shield(asyncio.to_thread(child.kill))
            raise
        return child

    async def release(self, child: AgentChild, *, healthy: bool) -> None:
        if healthy and child.alive() and len(self._idle) < self.capacity:
            self._idle.append(child)
            return
        if child.alive():
            self.killed += 1
            # Off the event loop (the grace is a blocking wait), and to the end even if cancelled again.
            await asyncio.shield(asyncio.to_thread(child.kill))
        else:
            child.close()
        if len(self._idle) < self.capacity:
            self._idle.append(self._spawn())  # warm again before the next task needs it

    def close(self) -> None:
        for child in self._idle:
            child.kill()
        self._idle.clear()

    async def run(
        self, call: AgentCall, ctx: AgentContext, *, deaf: Callable[[], bool] = lambda: False
    ) -> AgentRunResult:
        """Run `call` in a child; the child's callbacks are served from `ctx`. Cancellation kills the child, except
        while `deaf()` says this attempt cannot hear it: the test-only zombie (the scripted agent's `stall_s`),
        which is cut off from Temporal by construction and is stopped by the platform only once its item has ended
        (crewwork.steps.attempt.watch)."""
        child = await self.acquire()
        healthy = False
        try:
            serving = asyncio.ensure_future(_serve(child, call, ctx))
            me = asyncio.current_task()
            while True:
                try:
                    result = await asyncio.shield(serving)
                    break
                except asyncio.CancelledError:
                    if serving.done() or not deaf() or me is None:
                        serving.cancel()
                        raise
                    me.uncancel()
            # The child answered (a result, or the agent's own exception): it is fine and serves the next task.
            healthy = True
            if isinstance(result, BaseException):
                raise result
            return result
        finally:
            # Cancelled, or anything unexpected: the child may be in any state, so it is replaced, not reused.
            await self.release(child, healthy=healthy)


async def _serve(child: AgentChild, call: AgentCall, ctx: AgentContext) -> AgentRunResult | BaseException:
    """The child's answer: its result, or the exception the agent raised (returned, not raised, so the caller can
    tell an agent's error from a broken child). Raises when the child itself fails."""
    started = time.monotonic()
    child.send(("run", call))
    child.tasks += 1
    while True:
        msg = await child.recv()
        kind = msg[0]
        if kind == "heartbeat":
            ctx.heartbeat(*msg[1])
        elif kind == "partition":
            partition = ctx.extra.get("fault_partition")
            if callable(partition):
                partition()
        elif kind == "call":
            _id, name, args = msg[1], msg[2], msg[3]
            try:
                value: Any = None
                if name == "ensure_current":
                    await ctx.ensure_current()
                elif name == "save_artifact":
                    if ctx.save_artifact is None:
                        raise RuntimeError("this agent run cannot save artifacts")
                    value = await ctx.save_artifact(*args)
                else:
                    raise RuntimeError(f"unknown call {name!r}")
                child.send(("reply", _id, value, None))
            except Exception as exc:
                child.send(("reply", _id, None, portable(exc)))
        elif kind == "done":
            log.debug("agent %s ran in its process in %.3fs", call.agent, time.monotonic() - started)
            return msg[1]  # type: ignore[no-any-return]
        elif kind == "error":
            return msg[1]  # type: ignore[no-any-return]
        elif kind == "eof":
            code = child.proc.wait(5)
            raise AgentProcessDied(f"the agent process exited with code {code} before the agent finished")
        else:
            raise AgentInfraError(f"unexpected message from the agent process: {kind!r}")


def call_for(agent: str, plugins: str, ctx: AgentContext, *, allow_unsafe: bool = False) -> AgentCall:
    recipe = None
    if ctx.sandbox is not None:
        recipe = (ctx.sandbox.name, allow_unsafe, getattr(ctx.sandbox, "settings", None))
    extra = {k: v for k, v in ctx.extra.items() if not callable(v)}
    return AgentCall(
        agent=agent,
        plugins=plugins,
        fields={f: getattr(ctx, f) for f in _PLAIN_FIELDS},
        sandbox_recipe=recipe,
        extra=extra,
        env=dict(os.environ),
    )


__all__ = ["KILL_GRACE_S", "AgentCall", "AgentChild", "AgentProcessDied", "AgentProcesses", "call_for"]
