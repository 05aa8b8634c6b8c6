"""Writing to a child process's stdin on the event loop, the same on uvloop and on the standard loop.

A child may exit, or close its stdin, before it has read what it was given (git refusing its arguments at once, a
`cat-file --batch` that stopped at an answer it did not like). What it did not read it no longer wants. The standard
loop drops a write to such a pipe (and `drain` raises BrokenPipeError or ConnectionResetError); uvloop raises
RuntimeError from the write itself ("unable to perform operation on <WriteUnixTransport closed=True ...>"), which
reached an MCP tool's caller as an internal error (tests/mcp/test_mcp_attacks.py). Every write to a child's stdin
goes through `feed`."""

from __future__ import annotations

import asyncio
import contextlib

CLOSED_PIPE = (BrokenPipeError, ConnectionResetError)
"""What `drain` and `close` raise once the child has gone."""


def feed(stdin: asyncio.StreamWriter, data: bytes) -> bool:
    """Buffer `data` for the child unless its stdin is closed already; False when it is (nothing was written)."""
    if stdin.transport.is_closing():
        return False
    try:
        stdin.write(data)
    except RuntimeError:
        # uvloop: the pipe closed between the check and the write (the handle is closed). Anything else is a bug.
        if stdin.transport.is_closing():
            return False
        raise
    return True


async def feed_all(stdin: asyncio.StreamWriter, data: bytes) -> bool:
    """`feed`, then wait until the child has taken it (or gone); False when it went before taking all of it."""
    if not feed(stdin, data):
        return False
    try:
        await stdin.drain()
    except CLOSED_PIPE:
        return False
    return True


async def feed_and_close(stdin: asyncio.StreamWriter, data: bytes) -> bool:
    """All of `data` for the child, then the end of its input (what `Process.communicate(data)` does for stdin)."""
    try:
        return await feed_all(stdin, data)
    finally:
        close(stdin)


def close(stdin: asyncio.StreamWriter) -> None:
    """Close the child's stdin (end of input), whether or not the child is still there."""
    with contextlib.suppress(*CLOSED_PIPE):
        stdin.close()
