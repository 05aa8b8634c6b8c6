"""The event loop the long-running processes (the API, the pools) run on: `CREWWORK_EVENT_LOOP`.

uvloop (libuv) by default where it is installed: every step of crewwork is many small socket round trips (Temporal's
bridge, asyncpg, HTTP), and the standard loop's per-callback cost showed in every pool's profile (bench/trace.py
--profile: the asyncio loop and its self-pipe wake-ups were a fifth of a control process's busy samples). The
figures are in docs/performance.md. `asyncio` is the way back, per process, without a rebuild."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from crewwork.config import Settings

T = TypeVar("T")


def loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None for the standard loop (`asyncio`, or `auto` without uvloop installed)."""
    if settings.event_loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if settings.event_loop == "uvloop":
            raise RuntimeError(
                "CREWWORK_EVENT_LOOP=uvloop but uvloop is not installed (pip install uvloop), "
                "or set CREWWORK_EVENT_LOOP=asyncio"
            ) from None
        return None
    return uvloop.new_event_loop


def uses_uvloop(settings: Settings) -> bool:
    return loop_factory(settings) is not None


def run(main: Coroutine[Any, Any, T], settings: Settings) -> T:
    """`asyncio.run` on the configured loop."""
    with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
        return runner.run(main)


def uvicorn_options(settings: Settings) -> tuple[Literal["uvloop", "asyncio"], Literal["httptools", "h11"]]:
    """uvicorn's `loop` and `http` to match: uvloop with httptools (a C parser), else asyncio with h11."""
    if uses_uvloop(settings):
        return "uvloop", "httptools"
    return "asyncio", "h11"
