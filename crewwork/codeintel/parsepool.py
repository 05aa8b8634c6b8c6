"""Parsing a tenant's source without parsing it here: every file of a repository map is parsed by a child process
(crewwork.codeintel.parseworker), never in the process that asked (the API serves every tenant from one event loop,
and tree-sitter holds the interpreter lock while it parses: one file of 80,000 unclosed brackets once froze every
tenant's requests for 13 s).

Bounds, all from CREWWORK_CODEINTEL_* (docs/bounds.md):

- **concurrency**: at most `parse_workers` workers per process (per event loop); an index build holds one for its
  whole build, further builds wait for a free one;
- **memory**: each worker runs under `parse_memory_mb` (RLIMIT_DATA, crewwork.boundary.hostproc);
- **time**: each file has `parse_file_timeout_s`; past it the worker is killed (and a fresh one started for the next
  file), so one file can cost no more than that;
- **before parsing**: the worker refuses a file nested deeper than `parse_max_depth` or with a line longer than
  `parse_max_line_chars` without parsing it (the size bound, `max_file_bytes`, is applied before a blob is read).

A refused file is left out of the index, counted in its `skipped` under the reason, and remembered (`REFUSALS`, per
tenant registration and blob id, least recently used first past `MAX_REFUSALS`), so it is never parsed again on this
process, whichever commit holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import sys
from collections import OrderedDict
from dataclasses import dataclass
from types import TracebackType

from crewwork.boundary import hostproc
from crewwork.codeintel.tags import Definition, FileTags
from crewwork.config.codeintel import CodeIntelSettings

MAX_REFUSALS = 100_000
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_LEN = struct.Struct(">Q")


@dataclass(frozen=True)
class Refusal:
    """Why a file was left out of an index: `reason` is a key of the index's `skipped`."""

    reason: str
    detail: str


REFUSALS: OrderedDict[tuple[str, str], Refusal] = OrderedDict()
"""(tenant registration, blob id) -> why that blob is never parsed again on this process."""


def _remember(scope: str, sha: str, refusal: Refusal) -> None:
    REFUSALS[(scope, sha)] = refusal
    REFUSALS.move_to_end((scope, sha))
    while len(REFUSALS) > MAX_REFUSALS:
        REFUSALS.popitem(last=False)


def refused(scope: str, sha: str) -> Refusal | None:
    found = REFUSALS.get((scope, sha))
    if found is not None:
        REFUSALS.move_to_end((scope, sha))
    return found


_SLOTS: dict[tuple[int, int], tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}


def _slots(n: int) -> asyncio.Semaphore:
    """This event loop's worker slots (one API process has one loop; tests run several)."""
    loop = asyncio.get_running_loop()
    key = (id(loop), n)
    found = _SLOTS.get(key)
    if found is None or found[0] is not loop:  # (the loop is held, so its id is not reused while it is kept here)
        if len(_SLOTS) > 64:
            _SLOTS.clear()
        found = _SLOTS[key] = (loop, asyncio.Semaphore(n))
    return found[1]


class _Worker:
    """One parse worker process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _Worker:
        argv = [sys.executable, "-I", "-m", "crewwork.codeintel.parseworker"]
        # Nothing of this process's environment (database URLs, keys) reaches a process that reads tenant source.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"}
        proc = await asyncio.create_subprocess_exec(
            *hostproc.bounded(argv, hostproc.Profile.PARSE),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd="/",
            env=env,
            start_new_session=True,
        )
        return cls(proc)

    async def ask(self, header: dict[str, object], source: bytes, timeout_s: float) -> dict[str, object] | None:
        """The worker's answer, or None when it did not give one in time or died (it is stopped then)."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        frame = json.dumps(header).encode() + b"\n" + source
        try:
            stdin.write(_LEN.pack(len(frame)) + frame)
            await asyncio.wait_for(stdin.drain(), timeout_s)
            size = _LEN.unpack(await asyncio.wait_for(stdout.readexactly(_LEN.size), timeout_s))[0]
            if size > MAX_ANSWER_BYTES:
                raise ValueError("answer too large")
            body = await asyncio.wait_for(stdout.readexactly(size), timeout_s)
            answer = json.loads(body)
            return answer if isinstance(answer, dict) else None
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, RuntimeError, ValueError):
            await self.stop()
            return None

    @property
    def died_of(self) -> str:
        """Why a stopped worker ended, as a refusal reason."""
        code = self.proc.returncode
        if code in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGBUS):
            return "memory"
        return "parse_failed"

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), 10)


class ParseSession:
    """One index build's parsing: one worker slot of this process, held until the build ends.

    async with ParseSession(settings) as session:
        result = await session.parse(scope, sha, path, data)
    """

    def __init__(self, settings: CodeIntelSettings) -> None:
        self.settings = settings
        self.worker: _Worker | None = None
        self.slot: asyncio.Semaphore | None = None

    async def __aenter__(self) -> ParseSession:
        self.slot = _slots(self.settings.parse_workers)
        await self.slot.acquire()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self.worker is not None:
                await self.worker.stop()
        finally:
            self.worker = None
            assert self.slot is not None
            self.slot.release()

    async def parse(self, scope: str, sha: str, path: str, source: bytes) -> FileTags | Refusal | None:
        """The file's tags, a `Refusal`, or None for a file of no language crewwork indexes."""
        known = refused(scope, sha)
        if known is not None:
            return known
        s = self.settings
        if self.worker is None or self.worker.proc.returncode is not None:
            self.worker = await _Worker.start()
        header: dict[str, object] = {
            "path": path,
            "max_depth": s.parse_max_depth,
            "max_line_chars": s.parse_max_line_chars,
        }
        answer = await self.worker.ask(header, source, s.parse_file_timeout_s)
        if answer is None:
            worker, self.worker = self.worker, None
            if worker.proc.returncode == -signal.SIGKILL:
                refusal = Refusal(
                    "parse_timeout",
                    f"parsing took longer than {s.parse_file_timeout_s:g} s (CREWWORK_CODEINTEL_PARSE_FILE_TIMEOUT_S)",
                )
            else:
                refusal = Refusal(
                    worker.died_of,
                    f"the parse worker ended ({worker.proc.returncode}); its memory bound is "
                    f"{s.parse_memory_mb} MiB (CREWWORK_CODEINTEL_PARSE_MEMORY_MB)",
                )
            _remember(scope, sha, refusal)
            return refusal
        if "refused" in answer:
            refusal = Refusal(str(answer["refused"]), str(answer.get("detail", "")))
            _remember(scope, sha, refusal)
            return refusal
        tags = answer.get("tags")
        if not isinstance(tags, dict):
            return None
        return FileTags(
            str(tags["path"]),
            str(tags["language"]),
            [Definition(**d) for d in tags["definitions"]],
            {str(k): int(v) for k, v in tags["references"].items()},
        )
