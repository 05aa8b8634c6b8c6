"""Feeding a child's stdin when the child has gone already: the same answer on both event loops crewwork runs on
(crewwork/workspace/childio.py). Before it, the standard loop buffered such a write and dropped it, and uvloop raised
RuntimeError from the write, which reached an MCP tool's caller as an internal error."""

from __future__ import annotations

import asyncio

import pytest

from crewwork.cli import eventloop
from crewwork.config import Settings
from crewwork.workspace import childio


async def _gone_child() -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec("true", stdin=asyncio.subprocess.PIPE)
    await proc.wait()
    await asyncio.sleep(0.05)  # the loop notices the exit (uvloop closes the stdin pipe then)
    return proc


async def _feed_a_gone_child() -> tuple[bool, bool]:
    proc = await _gone_child()
    assert proc.stdin is not None
    fed = await childio.feed_all(proc.stdin, b"x" * 200_000)
    again = childio.feed(proc.stdin, b"y")
    childio.close(proc.stdin)
    childio.close(proc.stdin)  # twice: nothing raises
    return fed, again


async def _a_live_child_gets_everything() -> bytes:
    proc = await asyncio.create_subprocess_exec("cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    data = b"0123456789" * 50_000
    writer = asyncio.ensure_future(childio.feed_all(proc.stdin, data))
    out = bytearray()
    reading = asyncio.ensure_future(proc.stdout.read())
    assert await writer
    childio.close(proc.stdin)
    out.extend(await reading)
    await proc.wait()
    return bytes(out)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_child_that_has_gone_is_fed_nothing_and_nothing_raises(loop: str) -> None:
    fed, again = eventloop.run(_feed_a_gone_child(), Settings(event_loop=loop))  # type: ignore[arg-type]
    assert fed is False
    if loop == "uvloop":
        assert again is False  # the pipe is closed: not written (the standard loop may still buffer and drop it)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_live_child_reads_all_of_its_input(loop: str) -> None:
    out = eventloop.run(_a_live_child_gets_everything(), Settings(event_loop=loop))  # type: ignore[arg-type]
    assert out == b"0123456789" * 50_000
