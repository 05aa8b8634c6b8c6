"""The agent pool's child process: runs agent code for its parent (crewwork.agents.isolation), one call at a time.

`main([FD])`, in a process the pool's zygote forked (crewwork.agents.zygote; `python -m crewwork.agents.child FD`
runs it in a fresh interpreter): FD is this process's end of a socket pair. It imports the agents (already done in
a forked child), says `ready`, then serves `run` messages until the socket closes. The context's callbacks become messages to the parent
(`heartbeat`, `partition`, and the awaited `call`s `ensure_current` and `save_artifact`). On SIGTERM it cancels the
running agent (so a sandbox it started is cleaned up) and exits; the parent SIGKILLs the group if it does not.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any


class _Parent:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)

    def send(self, msg: Any) -> None:
        self.conn.send(msg)

    async def call(self, name: str, *args: Any) -> Any:
        call_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = fut
        self.send(("call", call_id, name, args))
        return await fut

    def answer(self, call_id: int, value: Any, error: BaseException | None) -> None:
        fut = self.pending.pop(call_id, None)
        if fut is None or fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


async def _run(parent: _Parent, call: Any) -> None:
    from crewwork.agents.base import AgentContext
    from crewwork.agents.classes import get_agent_class

    try:
        if call.env and call.env != dict(os.environ):
            from crewwork.config import reset_settings_cache

            os.environ.clear()
            os.environ.update(call.env)
            reset_settings_cache()
        sandbox = None
        if call.sandbox_recipe is not None:
            from crewwork.sandbox.backends import get_sandbox

            name, allow_unsafe, settings = call.sandbox_recipe
            sandbox = get_sandbox(name, allow_unsafe=allow_unsafe, settings=settings)

        def heartbeat(*details: Any) -> None:
            parent.send(("heartbeat", details))

        async def ensure_current() -> None:
            await parent.call("ensure_current")

        async def save_artifact(name: str, data: bytes, ctype: str = "text/plain") -> Any:
            return await parent.call("save_artifact", name, data, ctype)

        extra = dict(call.extra)
        extra["fault_partition"] = lambda: parent.send(("partition",))
        ctx = AgentContext(
            **call.fields,
            sandbox=sandbox,
            heartbeat=heartbeat,
            ensure_current=ensure_current,
            save_artifact=save_artifact,
            extra=extra,
        )
        result = await get_agent_class(call.agent, plugins=call.plugins)().run(ctx)
        parent.send(("done", result))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # everything the agent raises goes back to the activity, which classifies it
        parent.send(("error", portable(exc)))


async def serve(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    parent = _Parent(conn)
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    def pump() -> None:
        try:
            while conn.poll():
                inbox.put_nowait(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            inbox.put_nowait(None)

    loop.add_reader(conn.fileno(), pump)
    running: asyncio.Task[None] | None = None

    def stop() -> None:
        if running is not None and not running.done():
            running.cancel()
        inbox.put_nowait(None)

    loop.add_signal_handler(signal.SIGTERM, stop)
    # Imports the agents now, so that a task's cost is only its own.
    import crewwork.agents.classes
    import crewwork.sandbox.backends  # noqa: F401

    parent.send(("ready",))
    while True:
        msg = await inbox.get()
        if msg is None:
            break
        if msg[0] == "run":
            running = asyncio.create_task(_run(parent, msg[1]))
        elif msg[0] == "reply":
            parent.answer(msg[1], msg[2], msg[3])
    if running is not None and not running.done():
        running.cancel()
        try:
            await asyncio.wait_for(running, 0.5)
        except BaseException:  # exiting either way
            pass


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[0]))
    # The parent is the only reader of our stdout/stderr (the worker's log): keep them, but never read stdin.
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(serve(conn))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
