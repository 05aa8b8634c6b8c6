"""Running a host process with a wall-clock cap, bounded output capture and whole-tree kill on cancel.

Shared by the daemonless backends (bwrap, local). The child is a session leader, so killing its process
group takes its descendants with it; a cgroup, when the backend has one, catches any that left the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# After the main process exits, how long descendants holding the pipes open may keep us waiting.
PIPE_DRAIN_GRACE_S = 2.0
_CHUNK = 64 * 1024


@dataclass
class ProcessOutcome:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    duration_s: float


class _Capture:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.truncated = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(_CHUNK)
            if not chunk:
                return
            room = self.cap - len(self.buf)
            if room > 0:
                self.buf += chunk[:room]
            if len(chunk) > room:
                # Keep reading and discarding so a chatty command never blocks on a full pipe.
                self.truncated = True


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_log_bytes: int,
    preexec_fn: Callable[[], None] | None = None,
    kill_extra: Callable[[], None] | None = None,
    pass_fds: Sequence[int] = (),
) -> ProcessOutcome:
    """Run `argv`; on timeout or cancellation SIGKILL the process group (and `kill_extra`, e.g. a cgroup)."""
    out, err = _Capture(max_log_bytes), _Capture(max_log_bytes)
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        preexec_fn=preexec_fn,
        pass_fds=tuple(pass_fds),
    )
    assert proc.stdout is not None and proc.stderr is not None
    readers = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))

    def kill_tree() -> None:
        _killpg(proc.pid)
        if kill_extra is not None:
            kill_extra()

    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout=timeout_s)
        except TimeoutError:
            timed_out = True
            kill_tree()
            await proc.wait()
        duration = time.monotonic() - start
        # Leftover descendants die with the group; if one escaped it, the pipes may stay open.
        _killpg(proc.pid)
        if kill_extra is not None:
            kill_extra()
        try:
            await asyncio.wait_for(asyncio.shield(readers), timeout=PIPE_DRAIN_GRACE_S)
        except TimeoutError:
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await readers
    except asyncio.CancelledError:
        kill_tree()
        readers.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.shield(proc.wait())
        # Retrieved, so a cancelled run (a preview being stopped) logs no "exception was never retrieved".
        with contextlib.suppress(BaseException):
            await readers
        raise
    return ProcessOutcome(
        returncode=proc.returncode,
        stdout=bytes(out.buf),
        stderr=bytes(err.buf),
        truncated=out.truncated or err.truncated,
        timed_out=timed_out,
        duration_s=duration,
    )


def shell_status(rc: int | None) -> int | None:
    """Report a signalled process as 128+N like bwrap and container runtimes do, so backends compare."""
    return 128 - rc if rc is not None and rc < 0 else rc


def signal_from_returncode(rc: int | None, *, shell_style: bool) -> int | None:
    """The signal that ended a process, from a Popen returncode (negative) or a 128+N wrapper status."""
    if rc is None:
        return None
    if rc < 0:
        return -rc
    # bwrap and container runtimes report a signalled child as 128+N, like a shell.
    if shell_style and 128 < rc <= 128 + 64:
        return rc - 128
    return None


def apply_rlimits(memory_mb: int, pids: int, cpu_seconds: int) -> None:
    """Per-process caps for hosts without cgroups. Called in the child between fork and exec.

    RLIMIT_AS bounds address space, not RSS, so it is stricter than a cgroup for programs that map a lot.
    RLIMIT_NPROC counts every process of the real uid on the host and root ignores it, so it is only set
    for non-root workers.
    """
    import resource

    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.geteuid() != 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))


def rlimit_prefix(memory_mb: int, pids: int, cpu_seconds: int) -> list[str] | None:
    """The same caps as apply_rlimits via util-linux `prlimit`, so the spawn needs no preexec_fn."""
    import shutil

    exe = shutil.which("prlimit")
    if exe is None:
        return None
    args = [exe, f"--as={memory_mb * 1024 * 1024}", f"--cpu={cpu_seconds}:{cpu_seconds + 1}", "--core=0"]
    if os.geteuid() != 0:
        args.append(f"--nproc={pids}")
    return [*args, "--"]


def rlimit_enforcement() -> str:
    return "rlimit" if os.geteuid() != 0 else "rlimit(no-pids-cap-as-root)"
