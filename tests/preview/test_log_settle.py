"""The app's log is read once its output has stopped arriving (crewwork/preview/app.py `settled_log`): what the
relay copies late is still in the evidence, and a log that never stops growing costs at most the bound."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from crewwork.preview.app import AppPreview


def _reader(path: Path) -> AppPreview:
    app = AppPreview.__new__(AppPreview)  # only the log's reading is under test: no sandbox, no tunnels
    app._log_fd = os.open(path, os.O_RDONLY)
    app._log = bytearray()
    return app


async def test_output_that_arrives_late_is_in_the_log(tmp_path: Path) -> None:
    path = tmp_path / "app.log"
    path.write_bytes(b"GET / 200\n")
    app = _reader(path)

    async def relay_runs_late() -> None:
        # Each piece within the quiet period of the one before: the log is read after the last.
        for piece in (b"Traceback (most recent call last):\n", b"KeyError: 'quantity'\n"):
            await asyncio.sleep(0.1)
            with path.open("ab") as f:
                f.write(piece)

    late = asyncio.create_task(relay_runs_late())
    log = await app.settled_log(quiet_s=0.3, max_s=5.0)
    await late
    assert log.endswith(b"KeyError: 'quantity'\n"), log
    assert app.log() == log


async def test_a_log_that_never_stops_growing_is_read_within_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "app.log"
    path.write_bytes(b"")
    app = _reader(path)
    stop = asyncio.Event()

    async def chatty() -> None:
        with path.open("ab", buffering=0) as f:
            while not stop.is_set():
                f.write(b"tick\n")
                await asyncio.sleep(0.02)

    task = asyncio.create_task(chatty())
    log = await app.settled_log(quiet_s=0.1, max_s=0.5)
    # It came back while the app was still writing: bounded, not waiting for a quiet that never comes.
    assert not task.done()
    stop.set()
    await task
    assert log.startswith(b"tick\n")
