"""Streaming git readers on a host-made git directory, for tenant questions (the MCP tools, the repository map):
many blobs through one `git cat-file --batch` (`read_blobs`), and a read-only command whose output is kept up to a
byte bound or a deadline (`run_bounded`). Same options as crewwork.repos.trees' commands (hardened configuration,
`--git-dir`, no protocol), started under the query profile's memory and CPU bounds and thread count
(crewwork.boundary.hostproc); a git that reaches them is TreeError(`limit_exceeded`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

from crewwork.boundary import hostproc
from crewwork.repos.git import git_env
from crewwork.repos.trees import TreeError, limit_exceeded
from crewwork.workspace import childio
from crewwork.workspace.gitops import HARDENED_CONFIG, WORKSPACE_CONFIG


async def read_blobs(git_dir: Path, shas: Iterable[str], *, timeout_s: float) -> AsyncIterator[tuple[str, bytes]]:
    """(sha, content) of each blob, in order, through one `git cat-file --batch` (callers filter sizes first from the
    listing, so each blob is already known to be small)."""
    wanted = [s for s in shas if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", s)]
    if not wanted:
        return
    proc = await _spawn(git_dir, "cat-file", "--batch", timeout_s=timeout_s)
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + timeout_s

    async def ask() -> None:
        assert proc.stdin is not None
        try:
            for sha in wanted:
                if not await childio.feed_all(proc.stdin, sha.encode() + b"\n"):
                    return
        finally:
            childio.close(proc.stdin)

    writer = asyncio.ensure_future(ask())
    try:
        for sha in wanted:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise TreeError(f"reading blobs took longer than {timeout_s:g} s", "timeout")
            header = (await asyncio.wait_for(proc.stdout.readline(), left_s)).decode().split()
            if len(header) == 2 and header[1] == "missing":
                continue
            if len(header) != 3:
                raise TreeError("git cat-file answered unexpectedly", "not_found")
            size = int(header[2])
            data = await asyncio.wait_for(proc.stdout.readexactly(size + 1), max(0.1, deadline - time.monotonic()))
            if header[1] == "blob":
                yield sha, data[:-1]
    except TimeoutError:
        raise TreeError(f"reading blobs took longer than {timeout_s:g} s", "timeout") from None
    finally:
        writer.cancel()
        await _reap(proc)


async def _spawn(git_dir: Path, *args: str, timeout_s: float, stderr: bool = False) -> asyncio.subprocess.Process:
    """git on a tenant's question: the query profile's memory bound, a CPU backstop for `timeout_s` and at most
    CREWWORK_GIT_QUERY_THREADS threads (crewwork.boundary.hostproc)."""
    threads = hostproc.query_git_threads()
    argv = ["git"]
    for item in (*HARDENED_CONFIG, *WORKSPACE_CONFIG, f"grep.threads={threads}", f"pack.threads={threads}"):
        argv += ["-c", item]
    argv += [f"--git-dir={git_dir}", *args]
    return await asyncio.create_subprocess_exec(
        *hostproc.bounded(argv, hostproc.Profile.QUERY, wall_clock_s=timeout_s, threads=threads),
        cwd=str(git_dir),
        env=git_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if stderr else asyncio.subprocess.DEVNULL,
        limit=1024 * 1024,
        start_new_session=True,
    )


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(asyncio.shield(proc.wait()), 10)


# ---------------------------------------------------------------------------------------------- output


@dataclass
class Bounded:
    """A command's output cut at a byte bound or a deadline: `truncated` / `timed_out` say which."""

    data: bytes
    truncated: bool = False
    timed_out: bool = False
    err: bytes = b""
    """The end of git's stderr (at most 4 KiB)."""


async def run_bounded(git_dir: Path, *args: str, max_bytes: int, timeout_s: float, stdin: bytes = b"") -> Bounded:
    """Run a read-only git command on `git_dir` and keep at most `max_bytes` of its output, stopping it there or at
    the deadline (what it printed until then is kept). Raises TreeError(`not_found`) when git fails without output."""
    proc = await _spawn(git_dir, *args, timeout_s=timeout_s, stderr=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out = bytearray()
    err = bytearray()
    result = Bounded(b"")

    async def read_err() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(4096):
            err.extend(chunk)
            del err[: max(0, len(err) - 4096)]

    err_reader = asyncio.ensure_future(read_err())
    try:
        await childio.feed_all(proc.stdin, stdin)
        childio.close(proc.stdin)
        deadline = time.monotonic() + timeout_s
        while True:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                result.timed_out = True
                break
            try:
                chunk = await asyncio.wait_for(proc.stdout.read(64 * 1024), left_s)
            except TimeoutError:
                result.timed_out = True
                break
            if not chunk:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), max(0.1, deadline - time.monotonic()))
                break
            out.extend(chunk)
            if len(out) > max_bytes:
                result.truncated = True
                del out[max_bytes:]
                break
    finally:
        await _reap(proc)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(err_reader, 1)
        err_reader.cancel()
    result.data = bytes(out)
    result.err = bytes(err)
    if proc.returncode not in (0, None) and hostproc.exhausted(proc.returncode, result.err.decode("utf-8", "replace")):
        raise limit_exceeded(args[0])
    if proc.returncode not in (0, None, -9) and not out and not result.timed_out and not result.truncated:
        # `git grep` exits 1 for "no match": callers that can see that pass it on themselves.
        if args and args[0] == "grep" and proc.returncode == 1:
            return result
        raise TreeError(f"git {args[0]} found nothing to show", "not_found")
    return result
